//! The learned name/address tagger, with its shipped weights: it finds people and addresses in
//! scripts and sentences written for this test (none of them a layout of the training
//! generator, several in scripts the rules have no lists for), leaves PII-free text in those
//! scripts alone, and the `tagger` option turns it on and off.

use hearth::curate::redact::{PiiType, RedactConfig, Redactor};

fn config(tagger: bool) -> RedactConfig {
    RedactConfig {
        tagger,
        ..RedactConfig::default()
    }
}

/// Whether some span of type `t` covers at least 90% of `value`'s characters in `text`.
fn covered(r: &Redactor, text: &str, value: &str, t: PiiType) -> bool {
    let start = text[..text.find(value).expect("value in text")]
        .chars()
        .count();
    let end = start + value.chars().count();
    let spans = r.find(text);
    let got = (start..end)
        .filter(|&i| {
            spans
                .iter()
                .any(|s| s.pii_type == t && s.start <= i && i < s.end)
        })
        .count();
    got * 10 >= (end - start) * 9
}

/// (text, value, type): names and addresses in sentences of their own language.
const FINDS: &[(&str, &str, PiiType)] = &[
    (
        "कल शाम अनिल कुमार शर्मा से बात हुई, उन्होंने फ़ाइल भेज दी।",
        "अनिल कुमार शर्मा",
        PiiType::Person,
    ),
    (
        "Вчера звонил Сергей Кузнецов насчёт договора.",
        "Сергей Кузнецов",
        PiiType::Person,
    ),
    ("昨天李明给我打了电话。", "李明", PiiType::Person),
    (
        "Χθες μίλησα με τον Νίκο Παπαδόπουλο για το έργο.",
        "Νίκο Παπαδόπουλο",
        PiiType::Person,
    ),
    (
        "اتصل بي أحمد المنصوري أمس بخصوص العقد.",
        "أحمد المنصوري",
        PiiType::Person,
    ),
    (
        "荷物は東京都渋谷区神南1-2-3に届きました。",
        "東京都渋谷区神南1-2-3",
        PiiType::Address,
    ),
    (
        "Офис переехал: г. Казань, ул. Баумана, д. 15.",
        "г. Казань, ул. Баумана, д. 15",
        PiiType::Address,
    ),
    (
        "ส่งเอกสารไปที่ 99/1 ถนนสุขุมวิท แขวงคลองเตย กรุงเทพฯ 10110 นะครับ",
        "99/1 ถนนสุขุมวิท แขวงคลองเตย กรุงเทพฯ 10110",
        PiiType::Address,
    ),
];

/// PII-free text in the same scripts: places, products and plain sentences.
const CLEAN: &[&str] = &[
    "Как настроить Kubernetes на Ubuntu 24.04?",
    "東京都の天気は晴れです。明日の会議は十時からです。",
    "The Eiffel Tower is in Paris, France.",
    "Ο καιρός στην Αθήνα είναι καλός σήμερα.",
    "كيف أتعلم لغة البرمجة بايثون بسرعة؟",
    "मुझे पायथन में एक फ़ंक्शन लिखना सिखाइए।",
];

/// How many of [`FINDS`] a redactor covers.
fn found(r: &Redactor) -> Vec<bool> {
    FINDS
        .iter()
        .map(|(t, v, ty)| covered(r, t, v, *ty))
        .collect()
}

/// Measured with the shipped weights: rules and tagger cover 5 of the 8, one more than the
/// rules alone; zeroed weights add nothing, random ones touch the clean texts.
#[test]
fn tagger_finds_names_and_addresses_in_other_scripts() {
    let on = found(&Redactor::new(config(true)));
    let off = found(&Redactor::new(config(false)));
    let n = on.iter().filter(|f| **f).count();
    assert!(n >= 5, "found {n} of {}: {on:?}", FINDS.len());
    assert!(
        on.iter().zip(&off).all(|(a, b)| *a || !*b),
        "the tagger lost a find"
    );
}

/// The rules touch none of the six. Measured with the tagger: four (the Russian, Japanese,
/// Arabic and Hindi sentences: every word of a caseless script wakes it; a training run from an
/// earlier generator touched three), which is why it is off by default; more means the tagger
/// got worse.
#[test]
fn tagger_leaves_pii_free_text_alone() {
    let touched = |r: &Redactor| -> Vec<&str> {
        CLEAN
            .iter()
            .copied()
            .filter(|t| !r.find(t).is_empty())
            .collect()
    };
    assert_eq!(touched(&Redactor::new(config(false))), Vec::<&str>::new());
    let on = touched(&Redactor::new(config(true)));
    assert!(on.len() <= 4, "touched: {on:#?}");
    // the Latin-script sentence never wakes it
    assert!(!on.contains(&CLEAN[2]));
}

#[test]
fn option_tagger() {
    let (on, off) = (Redactor::new(config(true)), Redactor::new(config(false)));
    let gained: Vec<&str> = FINDS
        .iter()
        .filter(|(t, v, ty)| covered(&on, t, v, *ty) && !covered(&off, t, v, *ty))
        .map(|(t, ..)| *t)
        .collect();
    assert!(
        !gained.is_empty(),
        "the tagger added nothing over the rules"
    );
    for t in gained {
        assert!(on.find(t).iter().any(|s| s.detector == "tagger"), "{t}");
        assert!(off.find(t).iter().all(|s| s.detector != "tagger"), "{t}");
    }
    // off by default: its held-out gain was small and it touches clean text (see
    // docs/redact-tagger.md)
    assert!(!RedactConfig::default().tagger);
}

#[test]
fn bad_weights_are_a_typed_error() {
    use hearth::curate::redact::tagger::{TaggerError, TaggerWeights};
    assert!(matches!(
        TaggerWeights::from_safetensors(b"not safetensors"),
        Err(TaggerError::Format(_))
    ));
}

/// With the tagger on, redaction is still idempotent (the default-config property test runs
/// with it off).
#[test]
fn tagger_redaction_is_idempotent() {
    let on = Redactor::new(config(true));
    let mixed = [
        "Здравствуйте, меня зовут Ольга Смирнова, адрес: г. Казань, ул. Баумана, д. 15, кв. 4",
        "氏名：佐藤 花子\n住所：大阪府大阪市北区梅田1-2-3\n電話：06-1234-5678",
        "שלום, קוראים לי דנה לוי, אני גרה ברחוב הרצל 12, תל אביב",
        "ชื่อ สมชาย ใจดี ที่อยู่ 99/1 ถนนสุขุมวิท กรุงเทพฯ 10110",
    ];
    for t in FINDS
        .iter()
        .map(|f| f.0)
        .chain(CLEAN.iter().copied())
        .chain(mixed)
    {
        let once = on.redact(t).text;
        assert_eq!(on.redact(&once).text, once, "{t}");
    }
}
