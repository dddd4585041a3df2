//! Behaviour of the secret filter. Test keys are generated at run time so this file itself
//! holds nothing that a scanner (ours or gitleaks) would flag.

use hearth::curate::redact::{RedactConfig, Redactor};
use hearth::curate::secrets::{
    SecretAction, SecretConfig, SecretError, SecretScanner, findings_jsonl,
};

/// Deterministic pseudo-random string over `alphabet`.
fn rnd(seed: u64, n: usize, alphabet: &str) -> String {
    let a: Vec<char> = alphabet.chars().collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            a[(x % a.len() as u64) as usize]
        })
        .collect()
}

const AL: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn scanner() -> SecretScanner {
    SecretScanner::new(SecretConfig::default()).expect("default config")
}

fn samples() -> Vec<(String, &'static str)> {
    let p = |a: &str, b: &str| format!("{a}{b}");
    vec![
        (
            p(
                "AK",
                &format!("IA{}", rnd(1, 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")),
            ),
            "aws-access-key-id",
        ),
        (p("AI", &format!("za{}", rnd(2, 35, AL))), "gcp-api-key"),
        (p("gh", &format!("p_{}", rnd(3, 36, AL))), "github-pat"),
        (p("gl", &format!("pat-{}", rnd(4, 20, AL))), "gitlab-token"),
        (
            p(
                "xo",
                &format!(
                    "xb-{}-{}-{}",
                    rnd(5, 11, "0123456789"),
                    rnd(6, 12, "0123456789"),
                    rnd(7, 24, AL)
                ),
            ),
            "slack-token",
        ),
        (p("sk", &format!("_live_{}", rnd(8, 24, AL))), "stripe-key"),
        (
            p("SG", &format!(".{}.{}", rnd(9, 22, AL), rnd(10, 43, AL))),
            "sendgrid-api-key",
        ),
        (p("sk", &format!("-{}", rnd(11, 48, AL))), "openai-api-key"),
        (
            p("sk", &format!("-proj-{}", rnd(12, 64, AL))),
            "openai-api-key",
        ),
        (
            p("sk", &format!("-ant-api03-{}AA", rnd(13, 93, AL))),
            "anthropic-api-key",
        ),
        (
            p("hf", &format!("_{}", rnd(14, 34, AL))),
            "huggingface-token",
        ),
        (p("np", &format!("m_{}", rnd(15, 36, AL))), "npm-token"),
        (
            p("py", &format!("pi-AgEIcHlwaS5vcmc{}", rnd(16, 60, AL))),
            "pypi-token",
        ),
        (
            format!("{}:AA{}", rnd(17, 9, "123456789"), rnd(18, 33, AL)),
            "telegram-bot-token",
        ),
        (
            format!("SK{}", rnd(19, 32, "0123456789abcdef")),
            "twilio-api-key",
        ),
        (
            p(
                "ey",
                &format!(
                    "J{}.eyJ{}.{}",
                    rnd(20, 20, AL),
                    rnd(21, 30, AL),
                    rnd(22, 40, AL)
                ),
            ),
            "jwt",
        ),
    ]
}

fn rules_for(s: &SecretScanner, text: &str) -> Vec<(String, &'static str)> {
    s.scan(text)
        .into_iter()
        .map(|f| {
            (
                text.chars().skip(f.start).take(f.end - f.start).collect(),
                f.rule,
            )
        })
        .collect()
}

#[test]
fn provider_rules_in_prose_with_trailing_punctuation() {
    let s = scanner();
    for (key, rule) in samples() {
        for text in [
            format!("my key is {key}, can you check it?"),
            format!("my key is {key}."),
            format!("config: \"{key}\""),
            format!("(see [{key}])"),
            format!("export TOKEN={key}\n"),
        ] {
            let got = rules_for(&s, &text);
            assert_eq!(got, vec![(key.clone(), rule)], "{text:?}");
        }
    }
}

#[test]
fn private_keys_db_urls_and_assignments() {
    let s = scanner();
    let body: String = (0..6).map(|i| rnd(100 + i, 64, AL) + "\n").collect();
    let pem = format!("-----BEGIN RSA PRIVATE KEY-----\n{body}-----END RSA PRIVATE KEY-----");
    let text = format!("here:\n{pem}\nthanks");
    let got = rules_for(&s, &text);
    assert_eq!(got, vec![(pem.clone(), "private-key")]);
    let pw = rnd(30, 14, AL);
    let url = format!("DATABASE_URL=postgres://app:{pw}@db.example.org:5432/app");
    assert!(
        rules_for(&s, &url)
            .iter()
            .any(|(v, r)| v == &pw && *r == "url-password")
    );
    let assign = format!("db_password = \"{}\"", rnd(31, 18, AL));
    assert_eq!(rules_for(&s, &assign).len(), 1);
    // A certificate is public: its base64 is no secret; a private key beside it still is.
    let cert = format!("-----BEGIN CERTIFICATE-----\n{body}-----END CERTIFICATE-----");
    assert!(
        rules_for(&s, &cert).is_empty(),
        "{:?}",
        rules_for(&s, &cert)
    );
    let both = format!("{cert}\n{pem}");
    assert_eq!(rules_for(&s, &both), vec![(pem.clone(), "private-key")]);
    // the same base64 outside any block is a bare token
    assert!(!rules_for(&s, &body).is_empty());
}

#[test]
fn placeholders_hashes_code_and_sentinels_are_not_secrets() {
    let s = scanner();
    for text in [
        "aws key AKIAIOSFODNN7EXAMPLE is the documented example",
        "OPENAI_API_KEY=your-key-here",
        "token: xxxxxxxxxxxxxxxxxxxxxxxx",
        "sha256 fb876e020a4fc512f52640b349e1d8158494e1cbfaef1f5ee9835dd33fc86b35",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",
        "id 9b2f6f7e-2c1a-4b8e-9d3c-0a1b2c3d4e5f",
        "let token = next_token.unwrap();",
        "fn login(password: &str, secret_key: SecretKey) -> Result<Token, Error>",
        "password=<SECRET:secret-assignment> and key <API_KEY> and <SECRET:github-pat>",
        "Use the placeholder YOUR_API_KEY_HERE in the sample config.",
        "postgres://user:${DB_PASSWORD}@localhost/db",
        // documentation URLs and placeholder passwords
        "let url = Url::parse(\"ftp://rms:secret123@example.com\")?;",
        "moz://foo:bar@servo/baz",
        // constant names, CamelCase types with numbers, encoder test vectors
        "ClientHandshakeTrafficSecret => \"CLIENT_HANDSHAKE_TRAFFIC_SECRET\",",
        "Box::new(ChaCha20Poly1305MessageDecrypter { dec_key, dec_offset })",
        "assert_eq!(\"/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uv\", out);",
        // a custom base64 alphabet, and a long encoded test vector (both from the `base64` crate's tests)
        "Alphabet::new(\"4QTRhE+Hiz0Nme6DsnuAFCP8WaojxdVOZpKL53r2=BIkqSUcbYJG91tvX7lywMgf\")",
        "let b64 = \"z3Uuv7+Xsn+acg0ZNRsw1/ZEl1FJEMw3kV0N0MaAZuEqXsMjfR2AE51PUsgwNEY4c+PdL3UxO/kcDInOe4+MiyeJL2mAapHLXk+7PBQ6hdqt5Oy4rwOIW4TvRzGHAW==\";",
    ] {
        assert!(
            s.scan(text).is_empty(),
            "{text:?} -> {:?}",
            rules_for(&s, text)
        );
    }
}

#[test]
fn redact_and_drop() {
    let key = format!("gh{}", format_args!("p_{}", rnd(40, 36, AL)));
    let text = format!("token {key} ok");
    let (out, f) = scanner().redact(&text);
    assert_eq!(out, "token <SECRET:github-pat> ok");
    assert_eq!(f.len(), 1);
    // redacting again finds nothing
    assert!(scanner().scan(&out).is_empty());
    let drop = SecretScanner::new(SecretConfig {
        action: SecretAction::Drop,
        ..SecretConfig::default()
    })
    .expect("config");
    assert_eq!(drop.redact(&text).0, "");
    assert_eq!(drop.redact("nothing here").0, "nothing here");
    // the PII redactor marks the same key as API_KEY
    let r = Redactor::new(RedactConfig::default()).redact(&text);
    assert_eq!(r.text, "token <API_KEY> ok");
}

#[test]
fn option_entropy_and_length_thresholds() {
    let tok = rnd(50, 40, AL);
    let text = format!("here {tok} there");
    assert_eq!(scanner().scan(&text).len(), 1, "bare random token");
    let strict = SecretScanner::new(SecretConfig {
        min_entropy_base64: 7.5,
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(strict.scan(&text).is_empty());
    let long = SecretScanner::new(SecretConfig {
        min_token_len: 48,
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(long.scan(&text).is_empty());
    let off = SecretScanner::new(SecretConfig {
        bare_tokens: false,
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(off.scan(&text).is_empty());
    let hex = format!("api_key = {}", rnd(51, 32, "0123456789abcdef"));
    assert_eq!(scanner().scan(&hex).len(), 1);
    let hex_strict = SecretScanner::new(SecretConfig {
        min_entropy_hex: 4.5,
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(hex_strict.scan(&hex).is_empty());
}

#[test]
fn option_allow_and_disabled_rules() {
    let key = format!("hf_{}", rnd(60, 34, AL));
    let text = format!("hf token {key}");
    assert_eq!(scanner().scan(&text).len(), 1);
    let allow = SecretScanner::new(SecretConfig {
        allow: vec![format!("^{}", &key[..10])],
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(allow.scan(&text).is_empty());
    let off = SecretScanner::new(SecretConfig {
        disabled_rules: vec!["huggingface-token".into(), "high-entropy-token".into()],
        ..SecretConfig::default()
    })
    .expect("cfg");
    assert!(off.scan(&text).is_empty());
}

#[test]
fn config_errors_are_typed() {
    let bad = SecretScanner::new(SecretConfig {
        allow: vec!["(".into()],
        ..SecretConfig::default()
    });
    assert!(matches!(bad, Err(SecretError::BadAllowPattern { .. })));
    let bad = SecretScanner::new(SecretConfig {
        disabled_rules: vec!["nope".into()],
        ..SecretConfig::default()
    });
    assert!(matches!(bad, Err(SecretError::UnknownRule(_))));
    let bad = SecretScanner::new(SecretConfig {
        min_entropy_hex: f64::NAN,
        ..SecretConfig::default()
    });
    assert!(matches!(bad, Err(SecretError::BadConfig(_))));
    assert!(serde_json::from_str::<SecretConfig>(r#"{"min_len": 3}"#).is_err());
    assert!(SecretScanner::rule_names().contains(&"private-key"));
}

#[test]
fn findings_jsonl_format() {
    let key = format!("gl{}", format_args!("pat-{}", rnd(70, 20, AL)));
    let input = format!("{{\"id\": 3, \"text\": \"k {key}.\"}}\n{{broken\n");
    let mut out = Vec::new();
    let st = findings_jsonl(&scanner(), input.as_bytes(), &mut out).expect("io");
    assert_eq!((st.records, st.findings, st.records_flagged), (1, 1, 1));
    assert!(matches!(st.errors[0], SecretError::BadLine { line: 2, .. }));
    let v: serde_json::Value = serde_json::from_slice(out.trim_ascii_end()).expect("json");
    assert_eq!(v["id"], 3);
    assert_eq!(v["secret"], key.as_str());
    assert_eq!(v["rule"], "gitlab-token");
}

#[test]
fn long_padded_base64_is_data_unless_it_is_der() {
    let s = scanner();
    // A 64-byte key in base64 (Azure storage keys look like this) stays a bare secret token.
    let key = format!("{}==", rnd(61, 86, AL));
    assert_eq!(s.scan(&format!("my key {key} ok")).len(), 1);
    // 130 characters of padded base64 are encoded content...
    let blob = format!("{}==", rnd(62, 130, AL));
    assert!(s.scan(&format!("payload {blob} ok")).is_empty());
    // ...unless they decode to DER: a private key pasted on one line without its PEM lines.
    let der = format!("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{}==", rnd(63, 98, AL));
    assert_eq!(s.scan(&format!("key {der} ok")).len(), 1);
    // An alphabet written out is no key; the same characters shuffled with repeats are.
    let alphabet = "4QTRhE+Hiz0Nme6DsnuAFCP8WaojxdVOZpKL53r2BIkqSUcbYJG91tvX7lywMgf";
    assert!(s.scan(alphabet).is_empty());
    let repeated = format!("{}{}", &alphabet[..30], &alphabet[..30]);
    assert_eq!(s.scan(&repeated).len(), 1);
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("readable source directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// No false positive on real source code: this repository's own Rust (the same directories
/// that scripts/score_curate.sh scans; `actors/` and the graphs plant a demo key on purpose).
/// A test literal shaped like a credential must be put together at run time.
#[test]
fn the_repositorys_own_source_holds_no_findings() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} files", files.len());
    let s = scanner();
    let found: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("UTF-8 source");
            s.scan(&text)
                .into_iter()
                .map(|f| format!("{}: {} at char {}", path.display(), f.rule, f.start))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}
