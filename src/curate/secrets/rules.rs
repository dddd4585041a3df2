//! The rule table: each provider's token shape or credential context as a regex, the keywords that wake it,
//! and how its hits are checked ([`Check`]), compiled once for all scanners.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::Regex;

/// How a rule's hit is validated after the regex matched.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Fixed-prefix provider token: boundaries + entropy of the body + placeholders.
    Token,
    /// `name = value` where the name says secret: value must look random, not like code.
    Assignment,
    /// Password inside a URL's userinfo.
    UrlPassword,
    /// PEM/PGP/OpenSSH block: body must hold real base64.
    KeyBlock,
}

pub(super) struct RuleDef {
    pub(super) name: &'static str,
    /// Lowercase literals; the rule runs only if one occurs (case-insensitively).
    pub(super) keywords: &'static [&'static str],
    /// Capture group 1, when present, is the secret; otherwise the whole match.
    pub(super) pattern: &'static str,
    pub(super) check: Check,
    /// Minimum entropy of the secret (bits/char) to reject `sk-xxxxxxxx…`-style placeholders.
    pub(super) min_entropy: f64,
}

/// Rules written for hearth (patterns follow each provider's documented token shapes).
pub(super) const RULES: &[RuleDef] = &[
    RuleDef {
        name: "aws-access-key-id",
        keywords: &["akia", "asia", "abia", "acca", "a3t"],
        pattern: r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}",
        check: Check::Token,
        min_entropy: 2.8,
    },
    RuleDef {
        name: "aws-secret-access-key",
        keywords: &["aws"],
        pattern: r#"(?i)aws[_.\-]?(?:secret[_.\-]?(?:access[_.\-]?)?key|sk)["']?\s*(?:=|:|:=|=>)\s*["']?([A-Za-z0-9/+]{40})"#,
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "gcp-api-key",
        keywords: &["aiza"],
        pattern: r"AIza[0-9A-Za-z_\-]{35}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gcp-service-account-key-id",
        keywords: &["private_key_id"],
        pattern: r#""private_key_id"\s*:\s*"([a-f0-9]{40})""#,
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gcp-oauth-client-secret",
        keywords: &["gocspx-"],
        pattern: r"GOCSPX-[A-Za-z0-9_\-]{28}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "azure-storage-key",
        keywords: &["accountkey="],
        pattern: r"(?i)AccountKey=([A-Za-z0-9+/]{86}==)",
        check: Check::Token,
        min_entropy: 4.0,
    },
    RuleDef {
        name: "azure-ad-client-secret",
        keywords: &["q~"],
        pattern: r"[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "github-pat",
        keywords: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
        pattern: r"gh[pousr]_[A-Za-z0-9]{36,255}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "github-fine-grained-pat",
        keywords: &["github_pat_"],
        pattern: r"github_pat_[A-Za-z0-9_]{82}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gitlab-token",
        keywords: &["glpat-", "gldt-", "glrt-", "glptt-", "glsoat-", "gr1348941"],
        pattern: r"(?:glpat|gldt|glrt|glptt|glsoat)-[A-Za-z0-9_\-]{20,}|GR1348941[A-Za-z0-9_\-]{20,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-token",
        keywords: &["xox"],
        pattern: r"xox[baprse]-[0-9A-Za-z\-]{10,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-app-token",
        keywords: &["xapp-"],
        pattern: r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-webhook",
        keywords: &["hooks.slack.com"],
        pattern: r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_\-]{30,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "stripe-key",
        keywords: &[
            "sk_live", "sk_test", "rk_live", "rk_test", "sk_prod", "rk_prod",
        ],
        pattern: r"(?:sk|rk)_(?:live|test|prod)_[0-9A-Za-z]{10,99}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "twilio-api-key",
        keywords: &["sk"],
        pattern: r"SK[0-9a-fA-F]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "sendgrid-api-key",
        keywords: &["sg."],
        pattern: r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "mailgun-key",
        keywords: &["key-"],
        pattern: r"key-[0-9a-f]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "anthropic-api-key",
        keywords: &["sk-ant-"],
        pattern: r"sk-ant-(?:api|admin|sid)\d{2}-[A-Za-z0-9_\-]{80,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "openai-api-key",
        keywords: &["sk-"],
        pattern: r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{32,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "huggingface-token",
        keywords: &["hf_", "api_org_"],
        pattern: r"hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "npm-token",
        keywords: &["npm_"],
        pattern: r"npm_[A-Za-z0-9]{36}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "pypi-token",
        keywords: &["pypi-ageicHlwaS5vcmc"],
        pattern: r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "discord-bot-token",
        keywords: &["discord"],
        pattern: r"[MNO][A-Za-z\d_\-]{23,25}\.[A-Za-z\d_\-]{6}\.[A-Za-z\d_\-]{27,38}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "discord-webhook",
        keywords: &["/api/webhooks/"],
        pattern: r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{60,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "telegram-bot-token",
        keywords: &[":aa"],
        pattern: r"\d{8,10}:AA[A-Za-z0-9_\-]{33}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "shopify-token",
        keywords: &["shpat_", "shpss_", "shpca_", "shppa_"],
        pattern: r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "digitalocean-token",
        keywords: &["dop_v1_", "doo_v1_", "dor_v1_"],
        pattern: r"do[por]_v1_[a-f0-9]{64}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "databricks-token",
        keywords: &["dapi"],
        pattern: r"dapi[a-f0-9]{32}(?:-\d)?",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "jwt",
        keywords: &["eyj"],
        pattern: r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "private-key",
        keywords: &["private key"],
        pattern: r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----",
        check: Check::KeyBlock,
        min_entropy: 0.0,
    },
    RuleDef {
        name: "url-password",
        keywords: &["://"],
        pattern: r"(?i)[a-z][a-z0-9+.\-]{1,20}://[^\s:/@<>]{1,64}:([^\s/@<>]{3,128})@[A-Za-z0-9.\-\[\]]",
        check: Check::UrlPassword,
        min_entropy: 0.0,
    },
    RuleDef {
        name: "secret-assignment",
        keywords: &[
            "pass",
            "pwd",
            "secret",
            "token",
            "key",
            "auth",
            "credential",
        ],
        pattern: r#"(?i)([a-z0-9_.\-]{0,40}(?:passw(?:or)?d|passwd|pwd|secret|token|api[_.\-]?key|apikey|access[_.\-]?key|auth[_.\-]?key|private[_.\-]?key|credentials?|client[_.\-]?secret))["']?[ \t]*(?:=|:|:=|=>|->)[ \t]*(?:"([^"\s<>]{8,200})"|'([^'\s<>]{8,200})'|([^\s'"<>;,()\[\]{}]{8,200}))"#,
        check: Check::Assignment,
        min_entropy: 0.0,
    },
];

/// Every rule's keywords with the rule's index (bits of [`super::SecretScanner::scan_selected`]'s
/// `rule_hits`), for a caller that searches them along with keywords of its own.
pub(crate) fn rule_keywords() -> impl Iterator<Item = (usize, &'static str)> {
    const _: () = assert!(RULES.len() <= 64, "rule hits are a u64 bit set");
    RULES
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.keywords.iter().map(move |k| (i, *k)))
}

/// Keywords are found case-insensitively; rules whose pattern is case-sensitive and contains
/// the keyword literally need it in that case, so that `ask`/`desk` do not wake the Twilio
/// rule (`SK…`). Exact: every match of these patterns contains the keyword in this case.
pub(super) fn keyword_case_ok(rule: &str, kw: &[u8]) -> bool {
    match rule {
        "twilio-api-key" => kw == b"SK",
        "aws-access-key-id" => !kw.iter().any(u8::is_ascii_lowercase),
        "mailgun-key" => kw == b"key-",
        _ => true,
    }
}

/// Name of the bare high-entropy token rule (no keyword, no prefix).
pub(super) const BARE_RULE: &str = "high-entropy-token";

pub(super) struct Compiled {
    pub(super) regexes: Vec<Regex>,
    /// Per rule, a variant with the long `{m,200}` value bounds opened to `{m,}` (a much
    /// smaller NFA, so capture search is far cheaper); used while no captured value exceeds
    /// 200 bytes, which makes its matches identical to the rule's (see `scan_once`).
    pub(super) fast: Vec<Option<Regex>>,
    /// Per rule with long counted repetitions, the pattern with every upper bound dropped
    /// (`{0,40}` -> `{0,}`): it matches wherever the rule does (a superset), and its lazy DFA
    /// stays small, so "no match here" is cheap; the rule itself runs only after a yes.
    pub(super) probe: Vec<Option<Regex>>,
    pub(super) ac: AhoCorasick,
    /// AC pattern index -> rule index.
    pub(super) kw_rule: Vec<usize>,
}

pub(super) static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    let regexes = RULES
        .iter()
        // Patterns are constants checked by the unit tests; failure is a programming error.
        .map(|r| Regex::new(r.pattern).expect("constant secret rule regex"))
        .collect();
    let mut kws = Vec::new();
    let mut kw_rule = Vec::new();
    for (i, r) in RULES.iter().enumerate() {
        for k in r.keywords {
            kws.push(k.to_ascii_lowercase());
            kw_rule.push(i);
        }
    }
    let ac = AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::Standard)
        .build(&kws)
        // Constant keyword list; building cannot fail for these few short literals.
        .expect("constant keyword automaton");
    let fast = RULES
        .iter()
        .map(|r| {
            r.pattern.contains(",200}").then(|| {
                Regex::new(&r.pattern.replace(",200}", ",}")).expect("constant secret rule regex")
            })
        })
        .collect();
    let bounded = regex::Regex::new(r"\{(\d+),(\d+)\}").expect("constant regex");
    let probe = RULES
        .iter()
        .map(|r| {
            let wide = bounded.captures_iter(r.pattern).any(|c| {
                let n = |k: usize| c[k].parse::<u32>().unwrap_or(0);
                n(2).saturating_sub(n(1)) >= 16
            });
            wide.then(|| {
                let open = bounded.replace_all(r.pattern, "{$1,}");
                Regex::new(&open).expect("constant secret rule regex")
            })
        })
        .collect();
    Compiled {
        regexes,
        fast,
        probe,
        ac,
        kw_rule,
    }
});
