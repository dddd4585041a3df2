//! Behaviour of the PII redactor: each type, validators, hard negatives, Unicode offsets,
//! idempotence, every config option, and the JSONL prediction format.

use hearth::curate::redact::{
    FilePathMode, PiiSpan, PiiType, RedactConfig, RedactError, Redactor, predict_jsonl,
};

fn red() -> Redactor {
    Redactor::new(RedactConfig::default())
}

fn types(r: &Redactor, text: &str) -> Vec<(String, PiiType)> {
    r.find(text)
        .into_iter()
        .map(|s| (slice(text, &s), s.pii_type))
        .collect()
}

fn slice(text: &str, s: &PiiSpan) -> String {
    text.chars().skip(s.start).take(s.end - s.start).collect()
}

fn has(r: &Redactor, text: &str, value: &str, t: PiiType) -> bool {
    types(r, text).iter().any(|(v, ty)| v == value && *ty == t)
}

#[test]
fn labels_and_sentinels() {
    for t in PiiType::ALL {
        assert_eq!(t.sentinel(), format!("<{}>", t.label()));
        assert_eq!(PiiType::from_label(t.label()), Some(*t));
    }
    assert_eq!(PiiType::CreditCard.label(), "CREDIT_CARD");
    assert_eq!(PiiType::IpAddress.sentinel(), "<IP_ADDRESS>");
}

#[test]
fn structured_types() {
    let r = red();
    let cases: &[(&str, &str, PiiType)] = &[
        (
            "mail me at jane.doe@example.org please",
            "jane.doe@example.org",
            PiiType::Email,
        ),
        (
            "call me back at +1 (916) 530-2931?",
            "+1 (916) 530-2931",
            PiiType::Phone,
        ),
        (
            "my number is 713.512.4377x012, thanks",
            "713.512.4377x012",
            PiiType::Phone,
        ),
        ("Phone: 0494 92 82 32", "0494 92 82 32", PiiType::Phone),
        // typed in lower case, still mod-97 valid
        (
            "my iban is gb82west12345698765432",
            "gb82west12345698765432",
            PiiType::Iban,
        ),
        // an issuer range outside the brand table, Luhn-valid, called a card
        (
            "points won on credit card 060426070011 transactions",
            "060426070011",
            PiiType::CreditCard,
        ),
        (
            "card 4111 1111 1111 1111 exp 09/27",
            "4111 1111 1111 1111",
            PiiType::CreditCard,
        ),
        (
            "mastercard 2221000000000009 ok",
            "2221000000000009",
            PiiType::CreditCard,
        ),
        (
            "amex 378282246310005.",
            "378282246310005",
            PiiType::CreditCard,
        ),
        ("my SSN is 123-45-6789.", "123-45-6789", PiiType::Ssn),
        (
            "IBAN GB82 WEST 1234 5698 7654 32 now",
            "GB82 WEST 1234 5698 7654 32",
            PiiType::Iban,
        ),
        (
            "Is this IBAN valid? DE89370400440532013000",
            "DE89370400440532013000",
            PiiType::Iban,
        ),
        (
            "server at 10.123.252.217 refuses",
            "10.123.252.217",
            PiiType::IpAddress,
        ),
        (
            "from 2d86:2d99:522d:49af:6218:9326:63cf:46c4 too",
            "2d86:2d99:522d:49af:6218:9326:63cf:46c4",
            PiiType::IpAddress,
        ),
        (
            "error: could not open /home/sharon42/.ssh/id_rsa: denied",
            "/home/sharon42/.ssh/id_rsa",
            PiiType::FilePath,
        ),
        (
            r"see C:\Users\obesson\Documents\tax.pdf",
            r"C:\Users\obesson\Documents\tax.pdf",
            PiiType::FilePath,
        ),
        (
            "device 3c:22:fb:12:ab:9e is mine",
            "3c:22:fb:12:ab:9e",
            PiiType::MacAddress,
        ),
        (
            "postgres://alice:{PW}@db.internal/app",
            "alice:{PW}",
            PiiType::UrlCredentials,
        ),
        (
            "I was born on 12/03/1985 in Leeds",
            "12/03/1985",
            PiiType::DateOfBirth,
        ),
        (
            "my passport number is X1234567.",
            "X1234567",
            PiiType::IdNumber,
        ),
        (
            "send ETH to 0x52908400098527886E0F7030069857D2E4169EE7",
            "0x52908400098527886E0F7030069857D2E4169EE7",
            PiiType::CryptoWallet,
        ),
    ];
    // built at run time so this file holds no credential-shaped literal
    let pw = ["s3", "cr3", "tPw"].concat();
    for (text, value, t) in cases {
        let (text, value) = (&text.replace("{PW}", &pw), &value.replace("{PW}", &pw));
        assert!(
            has(&r, text, value, *t),
            "{text:?}: want {value:?} as {t:?}, got {:?}",
            types(&r, text)
        );
    }
}

#[test]
fn validators_reject_lookalikes() {
    let r = red();
    // Luhn failures, bad IBAN checksum, impossible SSNs, unparsable IPs
    for text in [
        "Order 1087318719189048 has not shipped yet",
        "card 4111 1111 1111 1112",
        "IBAN GB82 WEST 1234 5698 7654 33",
        "mixed case Gb82wEst12345698765432 is some other token",
        "ticket 060426070011 was reopened",
        "ssn 666-12-3456 and 000-12-3456 and 123-00-4567",
        "bad ip 300.1.2.3 and 1.2.3",
        "foo@bar is not an address, nor is a@b.c1",
    ] {
        assert!(r.find(text).is_empty(), "{text:?} -> {:?}", types(&r, text));
    }
}

#[test]
fn hard_negatives_survive() {
    let r = red();
    for text in [
        "Upgrade from version 1.2.3 to 10.20.30 fixed it.",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b broke the build",
        "sha256 of the release is fb876e020a4fc512f52640b349e1d8158494e1cbfaef1f5ee9835dd33fc86b35, does it match?",
        "Request id 9b2f6f7e-2c1a-4b8e-9d3c-0a1b2c3d4e5f failed at 2025-03-04T10:20:30Z.",
        "Compute 123 * 456 - 7890 step by step.",
        "Set max_connections to 4096 and listen on port 54321.",
        "Debug this: why is the build slow?",
        "Ping me when the deploy is done.",
        "can you check why the bucket in region eu-west-1 is slow",
        "Paris is the capital of France and Berlin the capital of Germany.",
        "Listen on 0.0.0.0:8080 or 127.0.0.1 only?",
        "The meeting is at 10:30 in room 4B; bring the Q3 slides.",
        "Here's the docker command: docker run -p 8080:80 -v ./data:/data nginx:1.25.3",
        "Use the placeholder YOUR_API_KEY_HERE in the sample config.",
        "The file is at ./src/main.rs and the tests in tests/it.rs.",
    ] {
        assert!(r.find(text).is_empty(), "{text:?} -> {:?}", types(&r, text));
    }
}

#[test]
fn names_and_addresses() {
    let r = red();
    assert!(has(
        &r,
        "hi, my name is Theresa Cabrera and I need help",
        "Theresa Cabrera",
        PiiType::Person
    ));
    assert!(has(
        &r,
        "Thanks Mrs. Vargas!",
        "Mrs. Vargas",
        PiiType::Person
    ));
    assert!(has(
        &r,
        "Please draft a reply to Käthe Hecker (k@h.de)",
        "Käthe Hecker",
        PiiType::Person
    ));
    assert!(has(
        &r,
        "New address: 669 Perez Crescent, West Felicia, MH 43757. Please update",
        "669 Perez Crescent, West Felicia, MH 43757",
        PiiType::Address
    ));
    assert!(has(
        &r,
        "ships to 11, avenue René Thomas, 67937 Allard.",
        "11, avenue René Thomas, 67937 Allard",
        PiiType::Address
    ));
    assert!(has(
        &r,
        "I moved to Scholzstraße 78, 95675 Neuss.",
        "Scholzstraße 78, 95675 Neuss",
        PiiType::Address
    ));
    assert!(has(
        &r,
        "send it to P.O. Box 104",
        "P.O. Box 104",
        PiiType::Address
    ));
}

/// Given names of many languages alone, with no cue around them, and a listed given name before a family
/// name that spells like an English word (the spelling model must not veto it); a given name that is also a
/// place, before a common word, stays a place.
#[test]
fn given_names_of_many_languages() {
    let r = red();
    for (text, name) in [
        ("Katrine will bring the slides.", "Katrine"),
        ("I asked Vsevolod about the deadline.", "Vsevolod"),
        ("Luiza sent the draft yesterday.", "Luiza"),
        ("Tomorrow Jouko takes the early shift.", "Jouko"),
        ("Margaret Hoover is on the invite list.", "Margaret Hoover"),
        ("Please call Catherine Butcher back.", "Catherine Butcher"),
    ] {
        assert!(
            has(&r, text, name, PiiType::Person),
            "{text}: {:?}",
            types(&r, text)
        );
    }
    let text = "Meet me at Victoria Station tomorrow.";
    assert!(
        !types(&r, text).iter().any(|(_, t)| *t == PiiType::Person),
        "{:?}",
        types(&r, text)
    );
}

/// A building number and a house number that together read like a phone number belong to the street they
/// run into; a phone number before other words stays a phone number.
#[test]
fn numbers_running_into_a_street_are_the_address() {
    let r = red();
    let text = "Our office is at 40417 3304 Oakridge St Apt. 12 Riverton";
    let found = types(&r, text);
    assert!(
        found
            .iter()
            .any(|(v, t)| *t == PiiType::Address && v.starts_with("40417 3304 Oakridge St")),
        "{found:?}"
    );
    assert!(
        !found.iter().any(|(_, t)| *t == PiiType::Phone),
        "{found:?}"
    );
    assert!(has(
        &r,
        "Call me at 555 1234 tomorrow.",
        "555 1234",
        PiiType::Phone
    ));
}

/// International address shapes: number-last streets, separate street-type words, address
/// blocks with region codes and quoted-mail prefixes, and cue-introduced streets.
#[test]
fn international_address_shapes() {
    let r = red();
    let cases: &[(&str, &str)] = &[
        // a building name after the house number, and a name word before it
        (
            "Send it to Lindgarden 14 Maple Forks\n Suite 12\n TROMSØ\n Norway 90210",
            "Lindgarden 14 Maple Forks\n Suite 12\n TROMSØ\n Norway 90210",
        ),
        // PO box with a leading number and a street name after it
        (
            "Mail: 4411 P.O. Box 77 Hazel Union\n Apt. 5\n Springfield\n Norway 12345",
            "4411 P.O. Box 77 Hazel Union\n Apt. 5\n Springfield\n Norway 12345",
        ),
        // separate lower-case street types (Hungarian, Norwegian), several name words
        (
            "It is at 12 Kossuth Lajos u. 7. today",
            "12 Kossuth Lajos u. 7",
        ),
        ("we are at 3 Bakken terrasse 19 now", "3 Bakken terrasse 19"),
        // region code lines: letters, lower case, a number
        (
            "address: 81 Elm Street\nRivertown\n, QX\n 40421",
            "81 Elm Street\nRivertown\n, QX\n 40421",
        ),
        (
            "address: 81 Elm Street\nRivertown\n, 12\n 40421",
            "81 Elm Street\nRivertown\n, 12\n 40421",
        ),
        // `, and` before the next address is no region code
        (
            "ship to 81 Elm Street\nRivertown\n, QX\n 40421, and 12345 Oak Road Suite 4",
            "81 Elm Street\nRivertown\n, QX\n 40421",
        ),
        // a town of two words, one of them a known place, before a state code
        (
            "ship to 5 Oak Road\nPorto Alegre\n, RS\n Brazil 90010",
            "5 Oak Road\nPorto Alegre\n, RS\n Brazil 90010",
        ),
        // quoted mail with several prefix marks per line
        (
            "??? 2201 Amberweg 4\n??? Suite 9\n??? Uruguay 11000",
            "2201 Amberweg 4\n??? Suite 9\n??? Uruguay 11000",
        ),
        // cue + number-last street without a type word
        ("She lives on Calle Mayor Baja 12.", "Calle Mayor Baja 12"),
        (
            "He lives on the east side of Ribeira Nova 88.",
            "Ribeira Nova 88",
        ),
        // Spanish abbreviations, Italian particles
        (
            "The shop is at C/ Olmos Altos 9 in town",
            "C/ Olmos Altos 9",
        ),
        ("Teo lives on Via dei Gelsi 4 street.", "Via dei Gelsi 4"),
        // lower-case street words after a numbered prefix type, unit ends the street
        (
            "my address is 9 rue des peupliers Rivaud Apt. 3 SAINT-LO France",
            "9 rue des peupliers Rivaud Apt. 3 SAINT-LO France",
        ),
        // a direction after the street type, a unit before the street
        (
            "taxi to 12 Harbour Street West\n Suite 2\n Oakvale\n New Zealand",
            "12 Harbour Street West\n Suite 2\n Oakvale\n New Zealand",
        ),
        (
            "Ms. Dana Oberg Suite 14 5521 Birkevej 3",
            "Suite 14 5521 Birkevej 3",
        ),
        // military address in lower case
        (
            "unit 2211 box 0042\ndpo ae 09876",
            "unit 2211 box 0042\ndpo ae 09876",
        ),
        // parenthesised glosses after town and country
        (
            "office: 7 Oak Road\nΛΕΥΚΑΡΑ (LEFKARA)\n, LA\n Cyprus (Greek) 7700",
            "7 Oak Road\nΛΕΥΚΑΡΑ (LEFKARA)\n, LA\n Cyprus (Greek) 7700",
        ),
    ];
    for (text, want) in cases {
        assert!(
            has(&r, text, want, PiiType::Address),
            "{text:?} -> {:?}",
            types(&r, text)
        );
    }
    // hard negatives for the same shapes
    for text in [
        "Meet me at Gate 12 after the talk.",
        "Meet me at Terminal 2",
        "meet me at Starbucks 5 minutes later",
        "We live on Level 3 of the tower.",
        "send 2 via email please",
        "the unit 4 box 2 is full",
        "Release 2 tie 3 games, said the coach.",
        "He wrote chapter 5 Main Ideas of the book.",
    ] {
        assert!(
            !types(&r, text).iter().any(|(_, t)| *t == PiiType::Address),
            "{text:?} -> {:?}",
            types(&r, text)
        );
    }
}

/// Person cues: name lists ending before a verb, lower-case names after a person field label,
/// and firm names made of family names (an organisation, not people).
#[test]
fn person_lists_fields_and_firms() {
    let r = red();
    // (text, name, whether it must be found as a person)
    let cases: &[(&str, &str, bool)] = &[
        (
            "Honestly, Krebbel and Salinas were the best engineers.",
            "Krebbel",
            true,
        ),
        (
            "Honestly, Krebbel and Salinas were the best engineers.",
            "Salinas",
            true,
        ),
        (
            "Honestly, Krebbel and Salinas were the best engineers.",
            "Honestly",
            false,
        ),
        (
            "name:    oddny k. varsami\nphone: n/a",
            "oddny k. varsami",
            true,
        ),
        ("our founders: Morrison, Rogers and Torres.", "Torres", true),
        // names led by several particles, greetings with `Okay`
        ("Thanks de la Fuenteovejuna!", "de la Fuenteovejuna", true),
        ("Okay Mikayla, I'll remember that.", "Mikayla", true),
        // a name with its e-mail in brackets, a name after `my friend`
        (
            "Please draft a reply to Reginald (rg@example.org) today",
            "Reginald",
            true,
        ),
        (
            "Write a card for my friend Mona, she loves hiking.",
            "Mona",
            true,
        ),
        // a name heading an address, an account holder
        (
            "Ship the package to Remigio, 12 Oak Road, Springfield, IL 62704.",
            "Remigio",
            true,
        ),
        (
            "Send it to IBAN DE89370400440532013000, account holder Zacharie.",
            "Zacharie",
            true,
        ),
        // a name opening the sentence before `and` and an accepted name
        (
            "Basilio and Julian Fisher are both on the list.",
            "Basilio",
            true,
        ),
        // a common word as a name right after someone's `name is`
        (
            "She was born in May. Her maiden name is Hope.",
            "Hope",
            true,
        ),
        ("The file name is Config.", "Config", false),
        // employer and place cues yield to a listed given name
        ("I work for Anna Berglund", "Anna Berglund", true),
        // a name used for a creative work
        ("I loved a Maren Haugvik album", "Maren Haugvik", true),
    ];
    for (text, name, want) in cases {
        assert_eq!(
            has(&r, text, name, PiiType::Person),
            *want,
            "{text:?} / {name:?} -> {:?}",
            types(&r, text)
        );
    }
    // hard negatives: config values after `name:`, firm names on a letterhead or before an
    // organisation word, brands and holidays before a work noun
    for text in [
        "Write to Support <help@example.com> for access",
        "We'll meet Thursday at Brightwell, 12 Oak Road, Springfield, IL 62704.",
        "Okay Google, play some music",
        "Sure, the build is green.",
        "I work for Kaltenbrunn Vossberg",
        "in Villanueva del Pardo there is a market",
        "We stayed a week in Castellvell Daroca",
        "I watched the Marvel movie yesterday",
        "We went to the Christmas concert",
        "The Disney film was long",
        "name: server01",
        "name: nginx",
        "Dana Whitfield\nBarnett, Melton and Garcia\n12 Main Street",
        "The Clark, Romero and Hall Orchestra was founded in 1977.",
    ] {
        let found = types(&r, text);
        assert!(
            !found
                .iter()
                .any(|(v, t)| *t == PiiType::Person && v != "Dana Whitfield"),
            "{text:?} -> {found:?}"
        );
    }
}

#[test]
fn unicode_offsets_are_chars() {
    let r = red();
    let text = "Grüße, Zoë — mail: zoë.x@exämple.de? no: zoe@example.de ✓";
    let spans = r.find(text);
    let email = spans
        .iter()
        .find(|s| s.pii_type == PiiType::Email)
        .expect("email found");
    assert_eq!(slice(text, email), "zoe@example.de");
    let n = text.chars().count();
    assert!(spans.iter().all(|s| s.start < s.end && s.end <= n));
}

#[test]
fn redaction_replaces_and_is_idempotent() {
    let r = red();
    let al = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let body: String = (0..36).map(|i| al[(i * 7 + 3) % 62] as char).collect();
    let key = ["gh", "p_", &body].concat();
    let text = &format!(
        "Ship the package to Jane Miller, 42 Main Street, Springfield, IL 62704. Phone: +1 (217) 555-0199, card 4111-1111-1111-1111, key {key}."
    );
    let once = r.redact(text);
    assert!(once.text.contains("<PERSON>") && once.text.contains("<ADDRESS>"));
    assert!(
        once.text.contains("<PHONE>")
            && once.text.contains("<CREDIT_CARD>")
            && once.text.contains("<API_KEY>")
    );
    let twice = r.redact(&once.text);
    assert_eq!(twice.text, once.text);
    assert!(twice.spans.is_empty(), "{:?}", twice.spans);
    // sentinels alone are never PII
    let all: String = PiiType::ALL
        .iter()
        .map(|t| format!("{} ", t.sentinel()))
        .collect();
    assert!(r.find(&all).is_empty());
}

/// A span that takes a neighbour's first token (`token=42`, an assignment the secret filter reports) leaves
/// the rest of the neighbour without its number; the redactor's re-scan of its own output finds it there, so
/// redacting twice changes nothing. Without the re-scan the street stayed in clear (a property-test find).
#[test]
fn the_rescan_closes_what_a_span_cut_off() {
    let r = red();
    // put together at run time: as a literal, the repository's own secret scan reports it
    let text = ["token", "=token=42 Main Street, Springfield, IL 62704"].concat();
    let once = r.redact(&text);
    assert!(once.text.contains("<ADDRESS>"), "{}", once.text);
    assert!(!once.text.contains("Main Street"), "{}", once.text);
    assert_eq!(r.redact(&once.text).text, once.text);
}

#[test]
fn option_types() {
    let text = "mail jane@example.org or call +1 (916) 530-2931";
    let mut c = RedactConfig::default();
    assert_eq!(Redactor::new(c.clone()).find(text).len(), 2);
    c.types = vec![PiiType::Phone];
    let spans = Redactor::new(c).find(text);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].pii_type, PiiType::Phone);
}

#[test]
fn option_keep_non_personal_ips() {
    let text = "bind 127.0.0.1 and 192.0.2.10, peer 8.8.4.4";
    let mut c = RedactConfig::default();
    assert_eq!(Redactor::new(c.clone()).find(text).len(), 1);
    c.keep_non_personal_ips = false;
    assert_eq!(Redactor::new(c).find(text).len(), 3);
}

#[test]
fn option_file_path_mode() {
    let text = "why is /home/sharon42/Desktop/notes.txt so big";
    let mut c = RedactConfig::default();
    assert_eq!(
        Redactor::new(c.clone()).redact(text).text,
        "why is <FILE_PATH> so big"
    );
    c.file_path_mode = FilePathMode::UserNameOnly;
    assert_eq!(
        Redactor::new(c).redact(text).text,
        "why is /home/<USER_NAME>/Desktop/notes.txt so big"
    );
}

#[test]
fn option_min_confidence() {
    // a trunk-prefixed number with no context is a low-confidence phone
    let text = "try 0491 536 237 maybe";
    let mut c = RedactConfig::default();
    assert_eq!(Redactor::new(c.clone()).find(text).len(), 1);
    c.min_confidence = 0.95;
    assert!(Redactor::new(c).find(text).is_empty());
}

#[test]
fn option_known_names() {
    let text = "ask zyxqor about it";
    let mut c = RedactConfig::default();
    assert!(Redactor::new(c.clone()).find(text).is_empty());
    c.known_names = vec!["Zyxqor".into()];
    assert_eq!(Redactor::new(c).redact(text).text, "ask <PERSON> about it");
}

#[test]
fn option_allow() {
    let text = "write to support@example.com or jane@example.org";
    let mut c = RedactConfig::default();
    assert_eq!(Redactor::new(c.clone()).find(text).len(), 2);
    c.allow = vec!["SUPPORT@example.com".into()];
    assert_eq!(Redactor::new(c).find(text).len(), 1);
}

#[test]
fn option_url_credentials() {
    let text = &format!(
        "clone https://bob:{}@git.example.org/repo.git",
        ["hun", "ter2"].concat()
    );
    let mut c = RedactConfig::default();
    assert!(has(
        &Redactor::new(c.clone()),
        text,
        "bob:hunter2",
        PiiType::UrlCredentials
    ));
    c.url_credentials = false;
    assert!(
        !types(&Redactor::new(c), text)
            .iter()
            .any(|(_, t)| *t == PiiType::UrlCredentials)
    );
}

#[test]
fn config_serde_rejects_unknown_fields() {
    let c: RedactConfig =
        serde_json::from_str(r#"{"keep_non_personal_ips": false}"#).expect("partial config");
    assert!(!c.keep_non_personal_ips);
    assert!(!c.types.is_empty());
    assert!(serde_json::from_str::<RedactConfig>(r#"{"keep_ips": false}"#).is_err());
}

#[test]
fn predict_jsonl_format_and_bad_lines() {
    let input = "{\"id\": 7, \"text\": \"mail jane@example.org\"}\nnot json\n\n{\"id\": \"x\", \"text\": \"nothing here\"}\n";
    let mut out = Vec::new();
    let st = predict_jsonl(&red(), input.as_bytes(), &mut out).expect("io ok");
    assert_eq!(st.records, 2);
    assert_eq!(st.spans, 1);
    assert_eq!(st.errors.len(), 1);
    assert!(matches!(st.errors[0], RedactError::BadLine { line: 2, .. }));
    assert!(st.errors[0].to_string().starts_with("line 2:"));
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], 7);
    assert_eq!(lines[0]["spans"][0]["type"], "EMAIL");
    assert_eq!(lines[0]["spans"][0]["start"], 5);
    assert_eq!(lines[0]["spans"][0]["end"], 21);
    assert_eq!(lines[1]["spans"].as_array().map(Vec::len), Some(0));
}
