//! A short smoke of every fuzz target in the normal test run: each corpus file
//! under fuzz/corpus (seeds and kept regression inputs) and a few thousand
//! deterministic mutations of them go through the same entry points that
//! `scripts/fuzz.sh` fuzzes for minutes.

use std::path::Path;

use tidemark::fuzzing::TARGETS;

/// splitmix64, so a failing mutation replays from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[allow(clippy::cast_possible_truncation)]
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Flips, inserts, deletes, duplicates a run or splices in an interesting byte.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 => v.insert(at, [0, 0xff, b'"', b'{', b'9', 0xa2, 0x1b][rng.below(7)]),
            2 if !v.is_empty() => {
                v.remove(at.min(v.len() - 1));
            }
            3 if !v.is_empty() => {
                let from = rng.below(v.len());
                let len = rng.below(16).min(v.len() - from);
                let run: Vec<u8> = v[from..from + len].to_vec();
                v.splice(at..at, run);
            }
            _ => v.truncate(at),
        }
    }
    v
}

#[test]
fn every_fuzz_target_survives_its_corpus_and_mutations_of_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| std::fs::read(e.expect("entry").path()).expect("corpus file"))
            .collect();
        assert!(!corpus.is_empty(), "no seeds for {name}");
        corpus.sort();
        for input in &corpus {
            target(input);
        }
        let mut rng = Rng(0x7469_6465 ^ name.len() as u64);
        let rounds = if name == "capture" || name == "config" {
            300
        } else {
            2_000
        };
        for _ in 0..rounds {
            let seed = &corpus[rng.below(corpus.len())];
            target(&mutate(&mut rng, seed));
        }
    }
}
