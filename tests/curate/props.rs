//! Property tests: on arbitrary text the redactor and the secret scanner never panic, report
//! valid, sorted, non-overlapping code-point spans, and redacting twice changes nothing more.

use std::sync::LazyLock;

use hearth::curate::redact::{RedactConfig, Redactor};
use hearth::curate::secrets::{SecretConfig, SecretScanner};
use proptest::prelude::*;

static RED: LazyLock<Redactor> = LazyLock::new(|| Redactor::new(RedactConfig::default()));
static SEC: LazyLock<SecretScanner> =
    LazyLock::new(|| SecretScanner::new(SecretConfig::default()).expect("default config"));

/// Text made of PII-like fragments, separators and arbitrary chars, so that detectors fire
/// and interact (adjacent spans, partial matches, multi-byte chars at every boundary).
fn texty() -> impl Strategy<Value = String> {
    let frag = prop_oneof![
        Just("Jane Miller".to_string()),
        Just("Mr. Smith".to_string()),
        Just("jane@example.org".to_string()),
        Just("+1 (916) 530-2931".to_string()),
        Just("4111 1111 1111 1111".to_string()),
        Just("123-45-6789".to_string()),
        Just("GB82 WEST 1234 5698 7654 32".to_string()),
        Just("10.0.0.1".to_string()),
        Just("::1".to_string()),
        Just("/home/bob/x.txt".to_string()),
        Just("42 Main Street, Springfield, IL 62704".to_string()),
        Just("Scholzstraße 5, 12345 Berlin".to_string()),
        Just("<PERSON>".to_string()),
        Just("<SECRET:jwt>".to_string()),
        Just("token=".to_string()),
        Just("ghp_".to_string()),
        Just("-----BEGIN PRIVATE KEY-----".to_string()),
        "[A-Za-z0-9+/=_-]{0,50}",
        "[ ,.:;\n\t()<>@'\"-]{0,3}",
        "\\PC{0,12}",
        any::<String>(),
    ];
    prop::collection::vec(frag, 0..12).prop_map(|v| v.concat())
}

fn check_spans(text: &str, spans: &[(usize, usize)]) -> Result<(), TestCaseError> {
    let n = text.chars().count();
    let mut last = 0;
    for &(s, e) in spans {
        prop_assert!(s < e && e <= n, "span {s}..{e} outside 0..{n}");
        prop_assert!(s >= last, "spans overlap or are unsorted");
        last = e;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn redactor_total_and_idempotent(text in texty()) {
        let once = RED.redact(&text);
        let spans: Vec<_> = once.spans.iter().map(|s| (s.start, s.end)).collect();
        check_spans(&text, &spans)?;
        prop_assert_eq!(RED.find(&text), once.spans.clone());
        let twice = RED.redact(&once.text);
        prop_assert_eq!(&twice.text, &once.text, "second pass changed: {:?}", twice.spans);
    }

    #[test]
    fn scanner_total_and_idempotent(text in texty()) {
        let (out, f) = SEC.redact(&text);
        let spans: Vec<_> = f.iter().map(|s| (s.start, s.end)).collect();
        check_spans(&text, &spans)?;
        let (out2, f2) = SEC.redact(&out);
        prop_assert!(f2.is_empty(), "second pass found {:?} in {:?}", f2, out);
        prop_assert_eq!(out2, out);
    }

    /// The bare-token pass probes only every `min_token_len`-th byte for a long run: moving
    /// the text right by any count of spaces moves every finding with it and loses none, so a
    /// run the probes missed at some offset would show here.
    #[test]
    fn bare_tokens_are_found_at_every_offset(
        pieces in prop::collection::vec(("[A-Za-z0-9+/=_-]{1,70}", "[ ,.;()\"]{1,2}"), 1..8),
        shift in 0usize..40,
    ) {
        let text: String = pieces.iter().map(|(run, sep)| format!("{run}{sep}")).collect();
        let moved = format!("{}{text}", " ".repeat(shift));
        let at = |f: &hearth::curate::secrets::SecretFinding| (f.start, f.end, f.rule);
        let found: Vec<_> = SEC.scan(&text).iter().map(at).collect();
        let found_moved: Vec<_> = SEC
            .scan(&moved)
            .iter()
            .map(|f| (f.start - shift, f.end - shift, f.rule))
            .collect();
        prop_assert_eq!(found, found_moved);
    }

    #[test]
    fn arbitrary_bytes_as_lossy_text(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let r = RED.redact(&text);
        prop_assert_eq!(RED.redact(&r.text).text, r.text);
        let _ = SEC.scan(&text);
    }
}
