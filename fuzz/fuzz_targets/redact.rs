//! `cargo +nightly fuzz run redact`: the redactor and the secret filter must never panic,
//! must report valid code-point spans, and must be idempotent on any input.
#![no_main]

use std::sync::LazyLock;

use hearth::curate::redact::{RedactConfig, Redactor};
use hearth::curate::secrets::{SecretConfig, SecretScanner};
use libfuzzer_sys::fuzz_target;

static RED: LazyLock<Redactor> = LazyLock::new(|| Redactor::new(RedactConfig::default()));
static SEC: LazyLock<SecretScanner> =
    LazyLock::new(|| SecretScanner::new(SecretConfig::default()).expect("default config"));

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let n = text.chars().count();
    let r = RED.redact(&text);
    let mut last = 0;
    for s in &r.spans {
        assert!(s.start >= last && s.start < s.end && s.end <= n);
        last = s.end;
    }
    assert_eq!(RED.redact(&r.text).text, r.text);
    let (out, found) = SEC.redact(&text);
    assert!(found.iter().all(|f| f.start < f.end && f.end <= n));
    assert!(SEC.scan(&out).is_empty());
});
