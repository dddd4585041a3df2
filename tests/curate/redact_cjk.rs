//! Person names in Chinese, Japanese and Korean running text, with the default redactor (the learned tagger
//! off): honorifics, particles only people take, self-introductions and verbs of handing something to
//! someone mark them; role nouns that take the same honorifics and plain sentences stay as they are.
//! Sentences written for this test.

use hearth::curate::redact::{PiiType, RedactConfig, Redactor};

/// (text, the name): each of the detector's cues, in a sentence of its own language.
const FINDS: &[(&str, &str)] = &[
    ("김민준 님, 회의 자료를 보내 드렸습니다.", "김민준"),
    ("박서연씨는 오늘 휴가입니다.", "박서연"),
    ("이 서류를 최수아에게 전달해 주세요.", "최수아"),
    ("처음 뵙겠습니다. 저는 정하늘입니다.", "정하늘"),
    ("明日は山田太郎さんと打ち合わせです。", "山田太郎"),
    ("鈴木様、ご注文ありがとうございます。", "鈴木"),
    ("エミリーさんから電話がありました。", "エミリー"),
    ("トーマスさんはいますか？", "トーマス"),
    ("佐々木先生の授業は休講です。", "佐々木"),
    ("我叫王小明，来自上海。", "王小明"),
    ("请把合同交给刘芳。", "刘芳"),
    ("联系人：陈建国", "陈建国"),
    ("张伟先生明天上午到。", "张伟"),
];

/// The same scripts without a person: role nouns with honorifics, and plain sentences.
const CLEAN: &[&str] = &[
    "선생님께 여쭤보세요.",
    "고객님, 주문이 접수되었습니다.",
    "어머님께서 전화하셨어요.",
    "강아지에게 밥을 줬어요.",
    "정원 씨앗을 심었다.",
    "오늘 날씨가 정말 좋네요.",
    "お客様各位、ご連絡いたします。",
    "皆さん、こんにちは。",
    "社長さんに会いました。",
    "ママさんバレーの練習です。",
    "明日の会議は十時からです。",
    "我和老师一起去了图书馆。",
    "请填写联系方式。",
    "数学老师今天不在。",
    "今天天气很好，我们去公园吧。",
];

/// Whether some PERSON span covers every character of `name` in `text`.
fn covered(r: &Redactor, text: &str, name: &str) -> bool {
    let start = text[..text.find(name).expect("name in text")]
        .chars()
        .count();
    let end = start + name.chars().count();
    let spans = r.find(text);
    (start..end).all(|i| {
        spans
            .iter()
            .any(|s| s.pii_type == PiiType::Person && s.start <= i && i < s.end)
    })
}

#[test]
fn names_in_cjk_running_text_are_found() {
    let r = Redactor::new(RedactConfig::default());
    let missed: Vec<&str> = FINDS
        .iter()
        .filter(|(t, n)| !covered(&r, t, n))
        .map(|(t, _)| *t)
        .collect();
    assert!(missed.is_empty(), "missed: {missed:#?}");
    // The span is the name: the honorific, particle or cue around it stays.
    let red = r.redact("김민준에게 연락하세요.").text;
    assert!(red.ends_with("에게 연락하세요."), "{red}");
    let red = r.redact("我叫王小明，来自上海。").text;
    assert!(
        red.starts_with("我叫") && red.ends_with("，来自上海。"),
        "{red}"
    );
}

#[test]
fn role_nouns_and_plain_cjk_text_are_left_alone() {
    let r = Redactor::new(RedactConfig::default());
    let touched: Vec<(&str, Vec<_>)> = CLEAN
        .iter()
        .map(|t| (*t, r.find(t)))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    assert!(touched.is_empty(), "touched: {touched:#?}");
}

/// Without PERSON among the types, none of it is found.
#[test]
fn cjk_names_follow_the_person_type() {
    let r = Redactor::new(RedactConfig {
        types: vec![PiiType::Email],
        ..RedactConfig::default()
    });
    assert!(FINDS.iter().all(|(t, _)| r.find(t).is_empty()));
}

/// Forms in these scripts write the full-width colon, and their person labels (`担当者`, `담당자`) are labels:
/// the value is the name, the label is not.
#[test]
fn cjk_form_fields_with_either_colon() {
    let r = Redactor::new(RedactConfig::default());
    for (text, name) in [
        ("氏名：佐藤花子", "佐藤花子"),
        ("姓名：王小明\n电话：138 1234 5678", "王小明"),
        ("担当：佐藤花子", "佐藤花子"),
        ("担当者: 佐藤花子", "佐藤花子"),
        ("담당자: 김민준", "김민준"),
        ("보내는 사람: 김민준", "김민준"),
    ] {
        let spans = r.find(text);
        let label = text.chars().take_while(|c| *c != ':' && *c != '：').count();
        assert!(covered(&r, text, name), "{text}: {spans:?}");
        assert!(
            spans.iter().all(|s| s.start >= label),
            "{text}: the label is redacted: {spans:?}"
        );
    }
}
