//! The documents name only what the repository has: every repository path named
//! in README.md, BENCHMARKS.md and docs/ exists, every link between them resolves
//! (anchors included), and every `docs/reference.md#anchor` the code cites is a
//! heading of the reference.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(doc: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let mut fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        }
        if !fence && let Some(h) = line.strip_prefix('#') {
            out.insert(anchor(h.trim_start_matches('#')));
        }
    }
    out
}

fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out
}

/// Tokens that name a file or folder of the repository: `src/...`, `tests/...` and the like.
fn repo_paths(text: &str) -> Vec<String> {
    const TOP: [&str; 9] = [
        "src/", "tests/", "scripts/", "configs/", "systemd/", "contrib/", "docs/", "benches/",
        "fuzz/",
    ];
    let mut out = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || "`()[]<>\"',;|*".contains(c)) {
        let w = word.trim_end_matches(['.', ':']);
        // Placeholders (`fuzz/corpus/TARGET`, `{gateway}`) name no file.
        let placeholder = w.contains(['{', '$', '…'])
            || w.split('/')
                .any(|s| s.len() > 1 && s.bytes().all(|b| b.is_ascii_uppercase()));
        if !TOP.iter().any(|t| w.starts_with(t)) || placeholder {
            continue;
        }
        let w = w.split('#').next().unwrap_or(w);
        out.push(w.to_string());
    }
    out
}

#[test]
fn every_path_and_link_in_the_documents_exists() {
    let mut missing = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for p in repo_paths(&text) {
            if !root().join(&p).exists() {
                missing.push(format!("{name}: {p}"));
            }
        }
        // Markdown links, relative to the document.
        for part in text.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or("");
            if target.starts_with("http") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !file.exists() {
                missing.push(format!("{name}: link {target}"));
            } else if !frag.is_empty()
                && file.extension().is_some_and(|x| x == "md")
                && !anchors(&file).contains(frag)
            {
                missing.push(format!("{name}: link {target} (no such heading)"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_code_cites_headings_the_reference_has() {
    let headings = anchors(&root().join("docs/reference.md"));
    let mut bad = BTreeSet::new();
    let mut files = vec![root().join("src"), root().join("tests")];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                files.push(e.unwrap().path());
            }
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") || p.ends_with("tests/docs_paths.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains(concat!("SPEC ", "§")),
            "{}: cites a document users do not have; cite docs/reference.md",
            p.display()
        );
        for part in text.split("docs/reference.md#").skip(1) {
            let a: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_'))
                .collect();
            if !headings.contains(&a) {
                bad.insert(format!("{}: #{a}", p.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "no such heading in docs/reference.md:\n{}",
        bad.into_iter().collect::<Vec<_>>().join("\n")
    );
}
