//! Person names in Chinese, Japanese and Korean running text. These scripts have no capitals and put no space
//! between a name and the words around it, so the capitalised-run model of [`super::names`] never sees them.
//! What marks a name there is what only people take: an honorific (`山田さん`, `김민준 님`, `王先生`), a
//! particle of giving to someone (`김민준에게`), a self-introduction (`我叫王小明`, `저는 이지은입니다`), or a
//! verb of handing or telling right before it (`发给张伟`). Where the cue alone is weak, the name must open
//! with a common family name, and words for roles (`社长さん`, `고객님`) are not names.
//!
//! Other scripts without capitals (Georgian, Thai, Arabic, Hebrew, Devanagari) share one cue here: a name
//! right after a self-introduction (`my name is`, `ผมชื่อ`, `ჩემი სახელია`), written apart from it.

use super::{Cand, PiiType, prio};

/// Korean family names (the first syllable of most Korean names).
const KO_SURNAMES: &str = concat!(
    "김이박최정강조윤장임한오서신권황안송류전홍고문양손배백허유남심노하곽성차주우구민",
    "진나지엄채원천방공현함변염여추도소석선설마길연위표명기반왕금옥육인맹제모탁국어은",
    "편용예경봉사부",
);

/// Chinese family names (single characters, the commonest ones).
const ZH_SURNAMES: &str = concat!(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘蒋蔡余",
    "杜叶程苏魏吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙",
    "史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔汤欧温康施文牛樊葛邢安齐易乔伍庞颜倪庄聂章鲁岳",
    "翟殷詹申耿关兰焦俞左柳甘祝包宁尚符舒阮柯纪梅童凌毕单季裴霍涂苗谷盛曲翁冉骆蓝路游",
    "辛靳管柴蒙鲍华喻祁蒲房滕屈饶牟艾尤阳穆农司卓古吉缪简车项连芦麦褚娄窦戚岑景党宫费",
    "卜冷晏席卫米柏宗瞿桂佟臧闵苟邬边卞姬师仇栾隋商刁沙荣巫寇桑郎甄丛仲虞敖巩明佘池查",
    "麻苑迟邝",
);

/// Korean endings of a word that only a person (or an animal) takes: honorific titles, and the dative and
/// honorific subject particles.
#[rustfmt::skip]
const KO_PERSON_ENDINGS: &[&str] = &[
    "님께서", "님에게", "님께", "님은", "님이", "님을", "님의", "님도", "님과", "님", "씨에게", "씨는",
    "씨가", "씨를", "씨의", "씨도", "씨와", "씨", "에게서", "에게", "한테", "께서",
];

/// Particles after a title written apart (`김민준 님은`).
#[rustfmt::skip]
const KO_TITLE_PARTICLES: &[&str] = &[
    "은", "는", "이", "가", "을", "를", "의", "도", "께", "께서", "에게", "과", "와",
];

/// Korean endings of a self-introduction's name (`저는 이지은입니다`).
const KO_INTRO_ENDINGS: &[&str] = &["입니다", "이에요", "예요", "이라고", "라고", "이야", "야"];

/// Korean words before a self-introduced name.
const KO_INTRO_CUES: &[&str] = &["저는", "나는", "이름은", "제이름은"];

/// Korean role nouns that take the same endings as names.
#[rustfmt::skip]
const KO_ROLES: &[&str] = &[
    "선생", "사장", "부장", "과장", "차장", "대리", "팀장", "실장", "교수", "고객", "손님", "회장", "이사",
    "이사장", "대표", "원장", "기사", "의사", "간호사", "작가", "부모", "여러분", "사모", "주인", "관리자",
    "담당자", "정비사", "조교", "조카", "이웃", "정부", "지인", "형님", "누님", "선배", "후배", "동료",
    "상사", "강사", "반장", "총장", "소장", "국장", "비서", "기자", "어머", "아버", "할머", "할아버", "신부",
    "하느", "하나", "임금", "공주", "왕자", "도련", "서방", "강아지", "고양이", "남편", "안내", "마음",
    "수수", "이분", "이쪽",
];

/// Japanese honorifics after a name, in kana (after the name's run) and in kanji (the run's end).
const JA_KANA_HONORIFICS: &[&str] = &["さん", "さま", "くん", "ちゃん"];
const JA_KANJI_HONORIFICS: &[&str] = &["様", "君", "氏", "殿", "先生"];

/// Japanese role nouns that take the same honorifics.
#[rustfmt::skip]
const JA_ROLES: &[&str] = &[
    "社長", "部長", "課長", "係長", "店長", "会長", "校長", "院長", "医者", "先生", "皆", "患者", "運転手",
    "看護師", "大家", "店員", "担当", "教授", "監督", "選手", "隣人", "友人", "彼女", "彼氏", "奥", "旦那",
    "兄", "姉", "弟", "妹", "父", "母", "お客", "客", "神", "王", "皆様", "部員", "社員", "職員", "主人",
    "業者", "作家", "ママ", "パパ", "コーチ", "ドクター", "パート", "バイト", "ガイド", "スタッフ",
    "オーナー", "ドライバー", "サンタ",
];

/// Chinese titles after a family name or a full name.
const ZH_TITLES: &[&str] = &["先生", "女士", "小姐", "老师", "同学"];

/// Chinese words right before a name.
#[rustfmt::skip]
const ZH_CUES: &[&str] = &[
    "我叫", "名字是", "名字叫", "联系人", "负责人", "收件人", "发件人", "经办人", "发给", "告诉", "交给",
    "转告", "问问", "转交",
];

/// Chinese characters that end a name taken after a cue (grammar and common words that follow it), and
/// words that a name's would-be third character opens.
const ZH_AFTER_NAME: &str = "的了吧吗呢和与说在是电打发把给让请也就都要会来去到个";
#[rustfmt::skip]
const ZH_WORDS_AFTER_NAME: &[&str] = &[
    "明天", "今天", "昨天", "后天", "明年", "今年", "去年", "先生", "女士", "小姐", "老师", "同学",
];

fn is_hangul(c: char) -> bool {
    ('\u{AC00}'..='\u{D7A3}').contains(&c)
}

fn is_han(c: char) -> bool {
    ('\u{4E00}'..='\u{9FFF}').contains(&c) || c == '\u{3005}'
}

fn is_katakana(c: char) -> bool {
    ('\u{30A1}'..='\u{30FA}').contains(&c) || c == 'ー'
}

fn is_kana(c: char) -> bool {
    ('\u{3041}'..='\u{3096}').contains(&c) || is_katakana(c)
}

/// Maximal runs of characters passing `is`, as byte ranges.
fn runs(text: &str, is: fn(char) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (is(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

fn person(out: &mut Vec<Cand>, s: usize, e: usize, confidence: f32) {
    out.push(Cand::new(
        s,
        e,
        PiiType::Person,
        "cjk-name",
        confidence,
        prio::PERSON,
    ));
}

/// Finds CJK person names in `text` (nothing to do in text without those scripts).
pub(crate) fn detect(text: &str, out: &mut Vec<Cand>) {
    if text.is_ascii() {
        return;
    }
    // One pass says which scripts are there; most non-ASCII text has none of them.
    let (mut hangul, mut han, mut kana) = (false, false, false);
    for c in text.chars().filter(|c| *c >= '\u{3041}') {
        hangul |= is_hangul(c);
        han |= is_han(c);
        kana |= is_kana(c);
    }
    if hangul {
        korean(text, out);
    }
    if kana {
        japanese(text, out);
    }
    if han {
        chinese(text, out);
    }
    intro_names(text, out);
}

/// Words before a self-introduced name (ASCII letters match in any case); the name follows after a space.
#[rustfmt::skip]
const INTRO_CUES: &[&str] = &[
    "my name is", "this is", "i am", "i'm", "je m'appelle", "c'est", "me llamo", "soy", "mi nombre es",
    "aqui é", "meu nome é", "ich bin", "mein name ist", "меня зовут", "Меня зовут", "это", "Это",
    "με λένε", "Με λένε", "ονομάζομαι", "私の名前は", "こちらは", "私は", "이름은", "저는", "ผมชื่อ", "ฉันชื่อ",
    "นี่คือ", "ชื่อ", "ჩემი სახელია", "მე ვარ", "ეს არის",
];

/// Endings after a self-introduced name that are not part of it.
#[rustfmt::skip]
const INTRO_NAME_ENDINGS: &[&str] = &[
    "입니다", "이에요", "예요", "이라고", "라고", "です", "と申します", "といいます", "と言います", "ครับ", "ค่ะ", "คะ",
];

/// Scripts whose names have no capitals (the capitalised-run model never sees them): a name's words are
/// runs of one of them.
fn uncased_script(c: char) -> Option<u8> {
    Some(match c {
        '\u{10D0}'..='\u{10FF}' => 1, // Georgian Mkhedruli
        '\u{0E01}'..='\u{0E4E}' => 2, // Thai, with its vowel and tone marks
        '\u{AC00}'..='\u{D7A3}' => 3, // Hangul syllables
        c if is_han(c) || is_kana(c) => 4,
        '\u{0620}'..='\u{064A}' | '\u{066E}'..='\u{06D3}' => 5, // Arabic letters
        '\u{05D0}'..='\u{05EA}' => 6,                           // Hebrew
        '\u{0905}'..='\u{0939}' | '\u{093E}'..='\u{094D}' => 7, // Devanagari
        _ => return None,
    })
}

/// `this is გურამ ხარაიშვილი`, `ผมชื่อ สีหราช ถนอมมนุษย์`, `제 이름은 강 현준`, `私の名前は 里佳`: after a
/// self-introduction, one to three words of a script without capitals (a leading initial, `ჯ.`, too). The
/// name must end there (a line's end, punctuation, a dash): more words of the script after it are prose.
fn intro_names(text: &str, out: &mut Vec<Cand>) {
    if !text.chars().any(|c| uncased_script(c).is_some()) {
        return;
    }
    static CUES: std::sync::LazyLock<aho_corasick::AhoCorasick> = std::sync::LazyLock::new(|| {
        aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(INTRO_CUES)
            // constant short literals: building cannot fail
            .expect("constant intro cues")
    });
    for m in CUES.find_iter(text) {
        if text[..m.start()]
            .chars()
            .next_back()
            .is_some_and(char::is_alphanumeric)
        {
            continue;
        }
        let mut at = m.end();
        let spaces = text[at..].len() - text[at..].trim_start_matches(' ').len();
        at += spaces;
        let Some(script) = text[at..].chars().next().and_then(uncased_script) else {
            continue;
        };
        // a cue in Latin or Cyrillic letters needs the space after it
        if spaces == 0
            && uncased_script(text[..m.end()].chars().next_back().unwrap_or(' ')).is_none()
        {
            continue;
        }
        let max_words = match script {
            2..=4 => 2,
            _ => 3,
        };
        let (s, mut e, mut words) = (at, at, 0);
        let mut ended_by_ending = false;
        loop {
            let word_len: usize = text[e..]
                .chars()
                .take_while(|&c| uncased_script(c) == Some(script))
                .map(char::len_utf8)
                .sum();
            if word_len == 0 {
                break;
            }
            let word = &text[e..e + word_len];
            if let Some(stem) = INTRO_NAME_ENDINGS.iter().find_map(|x| word.strip_suffix(x)) {
                if !stem.is_empty() {
                    e += stem.len();
                    words += 1;
                }
                ended_by_ending = true;
                break;
            }
            e += word_len;
            words += 1;
            // a leading initial: `ჯ. სამუშია`
            if words == 1 && word.chars().count() == 1 && text[e..].starts_with(". ") {
                e += 2;
                words = 0;
                continue;
            }
            if words == max_words || !text[e..].starts_with(' ') {
                break;
            }
            // one space, then a word of the same script, or the name ends
            if text[e + 1..].chars().next().and_then(uncased_script) != Some(script) {
                break;
            }
            e += 1;
        }
        if words == 0 || text[s..e].chars().filter(|c| !c.is_whitespace()).count() < 2 {
            continue;
        }
        let next = text[e..].trim_start_matches(' ').chars().next();
        if ended_by_ending || next.and_then(uncased_script) != Some(script) {
            person(out, s, e, 0.75);
        }
    }
}

fn korean(text: &str, out: &mut Vec<Cand>) {
    let words = runs(text, is_hangul);
    for (k, &(s, e)) in words.iter().enumerate() {
        let word = &text[s..e];
        // `김민준 님`, `박 씨`: the title as a word of its own right after the name
        let title_next = words.get(k + 1).is_some_and(|&(ns, ne)| {
            ns - e == 1
                && text[e..ns] == *" "
                && ["님", "씨"].iter().any(|t| {
                    text[ns..ne]
                        .strip_prefix(t)
                        .is_some_and(|r| r.is_empty() || KO_TITLE_PARTICLES.contains(&r))
                })
        });
        let stem = if title_next {
            Some(word)
        } else {
            KO_PERSON_ENDINGS
                .iter()
                .find_map(|end| word.strip_suffix(end))
        };
        if let Some(stem) = stem
            && name_like_ko(stem)
        {
            person(out, s, s + stem.len(), 0.8);
            continue;
        }
        // `저는 이지은입니다`, `제 이름은 박서연이에요`
        let cue = k >= 1 && {
            let (ps, pe) = words[k - 1];
            let prev = &text[ps..pe];
            text[pe..s].chars().all(|c| c == ' ')
                && (KO_INTRO_CUES.contains(&prev)
                    || k >= 2 && prev == "이름은" && &text[words[k - 2].0..words[k - 2].1] == "제")
        };
        if cue
            && let Some(stem) = KO_INTRO_ENDINGS
                .iter()
                .find_map(|end| word.strip_suffix(end))
            && name_like_ko(stem)
        {
            person(out, s, s + stem.len(), 0.8);
        }
    }
}

/// Two to four syllables, opening with a family name, and not a role noun.
fn name_like_ko(stem: &str) -> bool {
    let n = stem.chars().count();
    (2..=4).contains(&n)
        && stem.chars().next().is_some_and(|c| KO_SURNAMES.contains(c))
        && !KO_ROLES.iter().any(|r| stem.ends_with(r))
}

/// Called where the text has kana, so it is Japanese: `先生` after a name is then an honorific, and a name is
/// the whole kanji run before it (Chinese takes the family name from the end of the run instead).
fn japanese(text: &str, out: &mut Vec<Cand>) {
    for (s, e) in runs(text, is_han) {
        let run = &text[s..e];
        // `山田様`: a kanji honorific ends the run; `山田さん`: a kana one follows it
        let (name_end, honorific) =
            match JA_KANJI_HONORIFICS.iter().find_map(|h| run.strip_suffix(h)) {
                Some(name) => (s + name.len(), true),
                None => (
                    e,
                    JA_KANA_HONORIFICS.iter().any(|h| text[e..].starts_with(h)),
                ),
            };
        if honorific && name_like_ja(&text[s..name_end], 4) {
            person(out, s, name_end, 0.8);
        }
    }
    for (s, e) in runs(text, is_katakana) {
        if JA_KANA_HONORIFICS.iter().any(|h| text[e..].starts_with(h))
            && name_like_ja(&text[s..e], 10)
        {
            person(out, s, e, 0.8);
        }
    }
}

/// Two to `max` characters, and not a role noun.
fn name_like_ja(name: &str, max: usize) -> bool {
    (2..=max).contains(&name.chars().count()) && !JA_ROLES.iter().any(|r| name.ends_with(r))
}

fn chinese(text: &str, out: &mut Vec<Cand>) {
    for (s, e) in runs(text, is_han) {
        let run: Vec<(usize, char)> = text[s..e].char_indices().map(|(i, c)| (s + i, c)).collect();
        // `王先生`, `张伟女士`: a family name within the last three characters before a title
        for t in ZH_TITLES {
            let mut from = 0;
            while let Some(at) = text[s..e][from..].find(t) {
                let title = s + from + at;
                from += at + t.len();
                let before: Vec<&(usize, char)> = run.iter().filter(|(i, _)| *i < title).collect();
                let tail = &before[before.len().saturating_sub(3)..];
                if let Some(k) = tail.iter().position(|(_, c)| ZH_SURNAMES.contains(*c)) {
                    person(out, tail[k].0, title, 0.75);
                }
            }
        }
        // `我叫王小明`, `联系人：李娜`, `发给张伟`: a cue, then a family name and one or two more characters
        let mut cue_ends: Vec<usize> = Vec::new();
        for cue in ZH_CUES {
            let mut from = 0;
            while let Some(at) = text[s..e][from..].find(cue) {
                cue_ends.push(s + from + at + cue.len());
                from += at + cue.len();
            }
            // the cue at the run's end, the name after a colon or a space (`联系人：李娜`)
            if text[s..e].ends_with(cue) {
                let after = text[e..].trim_start_matches([':', '：', ' ']);
                let skipped = text.len() - e - after.len();
                if skipped > 0 && after.starts_with(is_han) {
                    cue_ends.push(e + skipped);
                }
            }
        }
        for at in cue_ends {
            let name: Vec<(usize, char)> = text[at..]
                .char_indices()
                .take_while(|(_, c)| is_han(*c))
                .take(3)
                .map(|(i, c)| (at + i, c))
                .collect();
            if name.len() < 2 || !ZH_SURNAMES.contains(name[0].1) {
                continue;
            }
            let third_ends = name.len() < 3
                || ZH_AFTER_NAME.contains(name[2].1)
                || ZH_WORDS_AFTER_NAME
                    .iter()
                    .any(|w| text[name[2].0..].starts_with(w));
            let len = if third_ends { 2 } else { 3 };
            let end = name
                .get(len)
                .map_or_else(|| name[len - 1].0 + name[len - 1].1.len_utf8(), |(i, _)| *i);
            person(out, name[0].0, end, 0.75);
        }
    }
}
