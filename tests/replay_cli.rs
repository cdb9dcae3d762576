//! `tidemark replay` on the committed capture: the expected output, byte for byte, every run.

mod support;

use std::path::Path;

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn replay(output: &Path) -> std::process::Output {
    support::tidemark()
        .args([
            "replay",
            "--config",
            &data("replay.toml"),
            "--input",
            &data("capture.jsonl"),
        ])
        .args(["--drain-ms", "300000", "--output"])
        .arg(output)
        .env_remove("RUST_LOG")
        .output()
        .expect("run tidemark replay")
}

#[test]
fn replay_of_the_committed_capture_gives_the_expected_output_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let expected = std::fs::read(data("replay_expected.jsonl")).unwrap();
    let mut runs = Vec::new();
    for i in 0..2 {
        let out = dir.path().join(format!("out{i}.jsonl"));
        let r = replay(&out);
        assert_eq!(
            r.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&r.stderr)
        );
        runs.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(runs[0], runs[1], "two runs differ");
    assert_eq!(
        String::from_utf8_lossy(&runs[0]),
        String::from_utf8_lossy(&expected),
        "output differs from tests/data/replay_expected.jsonl"
    );
}

#[test]
fn replay_output_lines_have_the_contract_shape() {
    let text = std::fs::read_to_string(data("replay_expected.jsonl")).unwrap();
    let mut topics = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let topic = v["topic"].as_str().unwrap();
        assert!(topic.starts_with("tidemark/site-a-gw1/"), "{topic}");
        assert_eq!(v["retain"].as_bool().unwrap(), topic.contains("/status/"));
        topics.insert(topic.split('/').nth(2).unwrap().to_string());
        if topic.contains("/windows/") {
            let p = &v["payload"];
            let id = format!(
                "{}/{}/{}/{}",
                p["group"].as_str().unwrap(),
                p["device"].as_str().unwrap(),
                p["start"],
                p["revision"]
            );
            assert_eq!(p["id"].as_str().unwrap(), id);
        }
    }
    let want: std::collections::BTreeSet<String> =
        ["alerts", "late", "rejected", "status", "windows"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(topics, want, "the capture exercises every output topic");
}

#[test]
fn a_malformed_capture_line_is_a_clear_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"arrival\": 1, \"topic\": \"a\", \"payload\": {}}\nnot json\n",
    )
    .unwrap();
    let r = support::tidemark()
        .args(["replay", "--config", &data("replay.toml"), "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("input line 2"));
}

#[test]
fn hostile_payloads_in_a_capture_are_rejected_outputs_not_replay_failures() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hostile.jsonl");
    let lines: [&str; 6] = [
        r#"{"arrival":1764480000000.0,"topic":"sensors/g/d/reading","payload":null,"qos":1}"#,
        r#"{"arrival":1764480000100,"topic":"sensors/g/d/reading","payload":"text"}"#,
        &format!(
            r#"{{"arrival":1764480000200,"topic":"sensors/g/d/reading","payload":{{"a":{}1{}}}}}"#,
            "[".repeat(40),
            "]".repeat(40)
        ),
        r#"{"arrival":1764480000300,"topic":"sensors/g/d/reading","payload_b64":"AAECAwQF"}"#,
        r#"{"arrival":1764480000400,"topic":"sensors/+/d/reading","payload":{"ts":1764480000400}}"#,
        r#"{"arrival":1764480000500,"topic":"sensors/g/d\u0000/reading","payload":{"ts":1764480000500}}"#,
    ];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let r = support::tidemark()
        .args(["replay", "--config", &data("replay.toml"), "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let out = String::from_utf8(r.stdout).unwrap();
    let reasons: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["payload"]["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "decode_error",
            "decode_error",
            "decode_error",
            "decode_error",
            "bad_topic",
            "bad_topic"
        ]
    );
}
