//! A short smoke of every fuzz target in the normal test run: each corpus file
//! under fuzz/corpus (seeds and kept regression inputs) and a few thousand
//! deterministic mutations of them go through the same entry points that
//! `scripts/fuzz.sh` fuzzes for minutes.

mod support;

use std::path::Path;

use support::engine::Rng;
use tidemark::fuzzing::TARGETS;

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
