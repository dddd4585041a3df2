//! Layout cues that hold across languages and scripts: a value's key says what it is, whatever
//! its script. Key-value lines (`Name: …`, `name = …`, YAML, forms), JSON pairs, mail and
//! commit headers (`From: "…" <…>`, `Author:`, `Signed-off-by:`), table columns (CSV, TSV,
//! Markdown) under a header naming them, chat speaker labels (`<nick>`, `… - Name:`), and the
//! name and address lines of a signature block after a closing phrase or at a letter's head. A
//! form's keys ([`form_labels`]) are labels, never speakers. Keys match with either colon (`:`,
//! `：`) and as written (`Όνομα`, `ชื่อ`).
//! Addresses in CJK and Hangul scripts are found by their administrative markers.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::LazyLock;

use compact_str::CompactString;
use memchr::memmem::Finder;
use smallvec::SmallVec;

use super::lexicon::{FxHasher, IN_COMMON, IN_FIRST, IN_LAST, IN_PLACES, LEX, StaticSet, fold_key};
use super::{Cand, PiiType, prio};

/// What a key announces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Field {
    Person,
    Address,
    Phone,
    Ssn,
}

/// Keys, normalised (lower case, only letters and digits kept), in several languages.
const PERSON_KEYS: &[&str] = &[
    "name",
    "fullname",
    "firstname",
    "lastname",
    "givenname",
    "familyname",
    "surname",
    "forename",
    "displayname",
    "realname",
    "author",
    "authorname",
    "signedoffby",
    "reviewedby",
    "coauthoredby",
    "ackedby",
    "testedby",
    "reportedby",
    "suggestedby",
    "committer",
    "contact",
    "contactname",
    "contactperson",
    "person",
    "customer",
    "customername",
    "applicant",
    "member",
    "employee",
    "patient",
    "recipient",
    "sender",
    "accountholder",
    "cardholder",
    "beneficiary",
    "attendee",
    "guest",
    "passenger",
    "tenant",
    "landlord",
    "client",
    "clientname",
    "nickname",
    "vorname",
    "nachname",
    "ansprechpartner",
    "kunde",
    "nombre",
    "apellido",
    "apellidos",
    "nom",
    "prenom",
    "nome",
    "cognome",
    "naam",
    "voornaam",
    "achternaam",
    "navn",
    "fornavn",
    "efternavn",
    "namn",
    "fornamn",
    "efternamn",
    "nimi",
    "etunimi",
    "sukunimi",
    "imie",
    "nazwisko",
    "jmeno",
    "prijmeni",
    "isim",
    "ad",
    "soyad",
    "soyadi",
    "adsoyad",
    "nev",
    "имя",
    "фамилия",
    "фио",
    "отчество",
    "імя",
    "прізвище",
    "ονομα",
    "επωνυμο",
    "이름",
    "성명",
    "氏名",
    "名前",
    "姓名",
    "联系人",
    "聯絡人",
    "名字",
    "お名前",
    "担当",
    "担当者",
    "差出人",
    "受取人",
    "送信者",
    "受信者",
    "성함",
    "담당자",
    "보내는사람",
    "받는사람",
    "발신자",
    "수신자",
    "收件人",
    "发件人",
    "负责人",
    "经办人",
    "申请人",
    "ชื่อ",
    "ชื่อ-นามสกุล",
    "นามสกุล",
];
const ADDRESS_KEYS: &[&str] = &[
    "address",
    "addr",
    "street",
    "streetaddress",
    "line1",
    "addressline1",
    "address1",
    "billingaddress",
    "shippingaddress",
    "homeaddress",
    "mailingaddress",
    "postaladdress",
    "deliveryaddress",
    "deliver",
    "deliverto",
    "adr",
    "delivery",
    "shipto",
    "shipping",
    "adresse",
    "anschrift",
    "strasse",
    "direccion",
    "domicilio",
    "indirizzo",
    "adres",
    "adresa",
    "adressi",
    "osoite",
    "endereco",
    "morada",
    "cim",
    "адрес",
    "адреса",
    "διευθυνση",
    "მისამართი",
    "հասցե",
    "aadress",
    "adrese",
    "adresas",
    "ที่อยู่",
    "주소",
    "住所",
    "地址",
    "所在地",
];
const PHONE_KEYS: &[&str] = &[
    "هاتف",
    "جوال",
    "تلفون",
    "טלפון",
    "फोन",
    "τηλ",
    "โทร",
    "โทรศัพท์",
    "เบอร์โทร",
    "phone",
    "tel",
    "telephone",
    "mobile",
    "cell",
    "cellphone",
    "fax",
    "phonenumber",
    "mobilephone",
    "homephone",
    "workphone",
    "telefon",
    "telefono",
    "telephono",
    "handy",
    "mob",
    "whatsapp",
    "puhelin",
    "telefonnummer",
    "mobil",
    "tlf",
    "телефон",
    "тел",
    "τηλεφωνο",
    "전화",
    "전화번호",
    "電話",
    "电话",
    "電話番号",
    "手机",
];
const SSN_KEYS: &[&str] = &[
    "ssn",
    "socialsecuritynumber",
    "socialsecurity",
    "socialsecurityno",
];

/// Labels of header and form lines whose value names no person.
const LABELS: &[&str] = &[
    "dob",
    "date",
    "subject",
    "messageid",
    "inreplyto",
    "references",
    "license",
    "version",
    "status",
    "priority",
    "ticket",
    "order",
    "ref",
    "id",
    "note",
    "error",
    "warning",
    "type",
    "signedoffby",
    "reviewedby",
    "ackedby",
    "testedby",
    "coauthoredby",
    "reportedby",
    "cc",
    "birthday",
    "born",
    "dateofbirth",
    "geburtsdatum",
    "email",
    "mail",
    "ssn",
    "tel",
    "fax",
];

/// Header keys whose value is `Name <mail>` or `"Name" <mail>`, on a line of their own.
const HEADER_PERSON_KEYS: &[&str] = &["from", "to", "cc", "bcc", "replyto", "returnpath"];

/// A normalised key (lower case, only letters and digits kept), on the stack: keys are looked
/// up once per line and per table cell, and most lines and cells name no field.
struct NormKey {
    bytes: [u8; MAX_KEY],
    len: usize,
    /// Longer than [`MAX_KEY`] bytes: no list holds it.
    long: bool,
}

/// The longest normalised key any list could hold.
const MAX_KEY: usize = 40;

impl NormKey {
    fn of(k: &str) -> Self {
        let mut key = NormKey {
            bytes: [0; MAX_KEY],
            len: 0,
            long: false,
        };
        if k.is_ascii() {
            for c in k.bytes().filter(u8::is_ascii_alphanumeric) {
                if key.len == MAX_KEY {
                    key.long = true;
                    break;
                }
                key.bytes[key.len] = c.to_ascii_lowercase();
                key.len += 1;
            }
            return key;
        }
        let folded: CompactString = fold_key(k)
            .chars()
            .filter(|c| c.is_alphanumeric())
            .map(greek_unaccented)
            .collect();
        if folded.len() > MAX_KEY {
            key.long = true;
        } else {
            key.bytes[..folded.len()].copy_from_slice(folded.as_bytes());
            key.len = folded.len();
        }
        key
    }

    fn as_str(&self) -> &str {
        // ASCII bytes, or a whole `str` copied in `of`
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }

    /// The lists of [`KEY_LISTS`] that hold this key (0 when none or too long).
    fn lists(&self) -> u8 {
        if self.long || self.len == 0 {
            return 0;
        }
        KEY_LISTS.get(self.as_str()).copied().unwrap_or(0)
    }
}

/// A Greek vowel without its tonos or dialytika (`Όνομα` and `ΟΝΟΜΑ` are one key).
fn greek_unaccented(c: char) -> char {
    match c {
        'ά' => 'α',
        'έ' => 'ε',
        'ή' => 'η',
        'ί' | 'ϊ' | 'ΐ' => 'ι',
        'ό' => 'ο',
        'ύ' | 'ϋ' | 'ΰ' => 'υ',
        'ώ' => 'ω',
        c => c,
    }
}

/// Bits of [`KEY_LISTS`]: which lists a normalised key is in.
const K_PERSON: u8 = 1;
const K_HEADER_PERSON: u8 = 2;
const K_ADDRESS: u8 = 4;
const K_PHONE: u8 = 8;
const K_SSN: u8 = 16;
/// Ends in `name`, `address` or `phone` but names no such field.
const K_NOT: u8 = 32;
const K_LABEL: u8 = 64;
const K_PLACE: u8 = 128;

/// Keys whose value names a place, an organisation or a role: never a person, though a town
/// such as `North Sarah` or a firm such as `Wolff & Brandt` is spelled like one.
const PLACE_KEYS: &[&str] = &[
    "city",
    "town",
    "village",
    "country",
    "state",
    "province",
    "region",
    "county",
    "district",
    "company",
    "companyname",
    "organization",
    "organisation",
    "org",
    "employer",
    "department",
    "dept",
    "team",
    "role",
    "jobtitle",
    "position",
    "stadt",
    "ort",
    "wohnort",
    "land",
    "firma",
    "ciudad",
    "pais",
    "empresa",
    "ville",
    "pays",
    "societe",
    "citta",
    "paese",
    "azienda",
    "stad",
    "miasto",
    "kraj",
    "gorod",
];

/// `filename`, `hostname` … end in `name` but name no person.
const NOT_FIELD_KEYS: &[&str] = &[
    "filename",
    "hostname",
    "username",
    "pathname",
    "dirname",
    "basename",
    "typename",
    "classname",
    "keyname",
    "tablename",
    "servername",
    "modulename",
    "packagename",
    "appname",
    "projectname",
    "branchname",
    "domainname",
    "devicename",
    "nodename",
    "fieldname",
    "columnname",
    "taskname",
    "eventname",
    "productname",
    "companyname",
    "orgname",
    "teamname",
    "groupname",
    "rolename",
    "repname",
    "dbname",
    "bucketname",
    "queuename",
    "channelname",
    "displayname",
    "ipaddress",
    "macaddress",
    "emailaddress",
    "mailaddress",
    "bindaddress",
    "listenaddress",
    "remoteaddress",
    "serveraddress",
    "localaddress",
    "hostaddress",
    "walletaddress",
    "contractaddress",
    "baseaddress",
];

/// Every key list in one map: one hash lookup per key instead of a scan of each list.
/// Keyed as [`NormKey`] normalises, so a list entry is written as people write the key (`ชื่อ`, `Όνομα`).
static KEY_LISTS: LazyLock<HashMap<CompactString, u8, BuildHasherDefault<FxHasher>>> =
    LazyLock::new(|| {
        let mut m: HashMap<CompactString, u8, BuildHasherDefault<FxHasher>> = HashMap::default();
        for (list, bit) in [
            (PERSON_KEYS, K_PERSON),
            (HEADER_PERSON_KEYS, K_HEADER_PERSON),
            (ADDRESS_KEYS, K_ADDRESS),
            (PHONE_KEYS, K_PHONE),
            (SSN_KEYS, K_SSN),
            (NOT_FIELD_KEYS, K_NOT),
            (LABELS, K_LABEL),
            (PLACE_KEYS, K_PLACE),
        ] {
            for k in list {
                *m.entry(NormKey::of(k).as_str().into()).or_default() |= bit;
            }
        }
        m
    });

fn field_of(k: &str, header: bool) -> Option<Field> {
    field_of_norm(&NormKey::of(k), header)
}

fn field_of_norm(k: &NormKey, header: bool) -> Option<Field> {
    if k.len == 0 || k.long {
        return None;
    }
    let lists = k.lists();
    if lists & K_PERSON != 0 || (header && lists & K_HEADER_PERSON != 0) {
        Some(Field::Person)
    } else if lists & K_ADDRESS != 0 {
        Some(Field::Address)
    } else if lists & K_PHONE != 0 {
        Some(Field::Phone)
    } else if lists & K_SSN != 0 {
        Some(Field::Ssn)
    } else {
        // `user.name`, `billing_address`, `contact-phone`: the last part decides
        let k = k.as_str();
        let tail = ["name", "address", "phone"]
            .into_iter()
            .find(|t| k.ends_with(t) && k.len() > t.len())?;
        if lists & K_NOT != 0 {
            return None;
        }
        Some(match tail {
            "name" => Field::Person,
            "address" => Field::Address,
            _ => Field::Phone,
        })
    }
}

/// A letter of a script without case (Han, Kana, Hangul, Thai, Arabic …).
fn uncased_letter(c: char) -> bool {
    c.is_alphabetic() && !c.is_lowercase() && !c.is_uppercase()
        // Georgian Mkhedruli is lower case to Unicode, but its writers have no capitals for names
        || ('\u{10D0}'..='\u{10FF}').contains(&c)
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0xAC00..=0xD7AF
        | 0x1100..=0x11FF | 0x3130..=0x318F)
}

const NAME_PARTICLES: &[&str] = &[
    "van", "von", "de", "der", "den", "da", "das", "do", "dos", "du", "di", "del", "della", "la",
    "le", "y", "e", "bin", "binti", "al", "el", "ten", "ter", "zu", "af", "av", "st",
];

/// Placeholder words that fill name fields without naming anyone.
const NOT_NAMES: &[&str] = &[
    "true",
    "false",
    "null",
    "none",
    "nil",
    "unknown",
    "n/a",
    "na",
    "tbd",
    "todo",
    "admin",
    "root",
    "user",
    "test",
    "example",
    "anonymous",
    "guest",
    "support",
    "team",
    "staff",
    "bot",
    "system",
    "default",
    "name",
    "noreply",
    "no-reply",
    "unassigned",
    "nobody",
    "everyone",
    // a team or a desk signing, in other languages
    "kundenservice",
    "kundendienst",
    "kundeservice",
    "kundtjanst",
    "asiakaspalvelu",
    "equipe",
    "equipo",
    "equipa",
    "squadra",
    "servizio",
    "helpdesk",
    "servicedesk",
    "команда",
    "поддержка",
    "チーム",
    "サポート",
    "팀",
    "团队",
    "客服",
];

/// Whether `v` reads as a person's name: up to five words in any script, each capitalised or
/// of a script without case, no digits or symbols. `lenient` accepts a single common word
/// (a table column or a field key already says it is a name).
fn name_like(v: &str, lenient: bool) -> bool {
    let n = v.chars().count();
    if n == 0 || n > 60 {
        return false;
    }
    if v.chars().any(|c| {
        c.is_ascii_digit()
            || matches!(
                c,
                '@' | '<'
                    | '>'
                    | '/'
                    | '\\'
                    | '='
                    | ':'
                    | '_'
                    | '#'
                    | '('
                    | ')'
                    | '['
                    | ']'
                    | '{'
                    | '}'
                    | '|'
                    | '*'
                    | '$'
                    | '%'
                    | '&'
                    | '+'
                    | '!'
                    | '?'
                    | ';'
            )
    }) {
        return false;
    }
    let words: SmallVec<[&str; 6]> = v
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    if words.is_empty() || words.len() > 5 {
        return false;
    }
    let mut real = 0;
    let mut all_common = true;
    for w in &words {
        let first = match w.chars().next() {
            Some(c) => c,
            None => return false,
        };
        // The particles are ASCII and hold no `k` (the Kelvin sign lower-cases to one): no
        // other char lower-cases into them, so an ASCII comparison is the lower-cased one.
        if NAME_PARTICLES.iter().any(|p| w.eq_ignore_ascii_case(p)) {
            continue;
        }
        if !(first.is_uppercase() || uncased_letter(first)) {
            return false;
        }
        // an all-capital word longer than an initial is an acronym, not a name
        if w.chars().filter(|c| c.is_alphabetic()).count() > 3
            && w.chars().all(|c| !c.is_lowercase())
            && first.is_uppercase()
            && words.len() > 1
        {
            return false;
        }
        real += 1;
        let key = fold_key(w.trim_end_matches('.'));
        if NOT_NAMES.contains(&key.as_str()) {
            return false;
        }
        let cls = LEX.class(&key);
        // camel case (`ValueError`) is code, not a name
        let inner_caps = w.chars().skip(1).any(char::is_uppercase)
            && w.chars().any(char::is_lowercase)
            && ![
                "Mc", "Mac", "De", "Di", "Da", "La", "Le", "Van", "Von", "O'",
            ]
            .iter()
            .any(|p| w.starts_with(p));
        if inner_caps {
            return false;
        }
        if cls & (IN_FIRST | IN_LAST) != 0
            || cls & (IN_COMMON | IN_PLACES) == 0 && !past_of_common(&key)
        {
            all_common = false;
        }
    }
    real > 0 && (lenient || !all_common)
}

/// `filed`, `noted`, `submitted`, `applied`: the past form of an ordinary English word (a form
/// label such as `Filed:`), which the vocabulary lists in its base form only.
fn past_of_common(key: &str) -> bool {
    let common = |w: &str| w.len() >= 3 && LEX.class(w) & IN_COMMON != 0;
    let Some(stem) = key.strip_suffix("ed") else {
        return false;
    };
    let b = stem.as_bytes();
    let mut with: CompactString = stem.into();
    with.push('e');
    common(stem)
        || common(&with)
        // `submitted`: a doubled last consonant
        // (an ASCII letter, so that the cut is on a char boundary)
        || b.len() >= 2
            && b[b.len() - 1].is_ascii_alphabetic()
            && b[b.len() - 1] == b[b.len() - 2]
            && common(&stem[..stem.len() - 1])
        // `applied`
        || stem.strip_suffix('i').is_some_and(|s| {
            let mut y: CompactString = s.into();
            y.push('y');
            common(&y)
        })
}

fn push(out: &mut Vec<Cand>, s: usize, e: usize, f: Field, detector: &'static str) {
    if e <= s {
        return;
    }
    let (ty, pr, conf) = match f {
        Field::Person => (PiiType::Person, prio::PERSON + 2, 0.8),
        Field::Address => (PiiType::Address, prio::ADDRESS, 0.8),
        Field::Phone => (PiiType::Phone, prio::PHONE, 0.85),
        Field::Ssn => (PiiType::Ssn, prio::SSN, 0.9),
    };
    out.push(Cand::new(s, e, ty, detector, conf, pr));
}

/// Trims spaces and one pair of quotes; returns the byte range within `v`.
fn trim_value(v: &str) -> (usize, usize) {
    let mut s = 0;
    let mut e = v.len();
    let b = v.as_bytes();
    while s < e && matches!(b[s], b' ' | b'\t') {
        s += 1;
    }
    while e > s && matches!(b[e - 1], b' ' | b'\t' | b'\r' | b',') {
        e -= 1;
    }
    if e > s + 1 && matches!(b[s], b'"' | b'\'') && b[e - 1] == b[s] {
        s += 1;
        e -= 1;
    }
    (s, e)
}

fn digits(v: &str) -> usize {
    v.bytes().filter(u8::is_ascii_digit).count()
}

fn phone_like(v: &str) -> bool {
    let v = without_extension(v);
    let d = digits(v);
    (7..=15).contains(&d)
        && v.bytes().all(|c| {
            c.is_ascii_digit() || matches!(c, b' ' | b'-' | b'.' | b'(' | b')' | b'+' | b'/')
        })
}

/// The number before an extension (`…x792`, `… ext. 12`, `…;ext=337`, `… #4`), or `v` when
/// it has none: the extension belongs to the value, but its digits are no part of the number.
fn without_extension(v: &str) -> &str {
    let b = v.as_bytes();
    let digits_end = b.len() - b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    if digits_end == b.len() || digits_end == 0 || b.len() - digits_end > 5 {
        return v;
    }
    let head = v[..digits_end].trim_end_matches([' ', '.', '=', ':']);
    for mark in ["extension", "ext", "x", "#"] {
        let Some(cut) = head.len().checked_sub(mark.len()) else {
            continue;
        };
        // an ASCII match leaves `cut` on a char boundary
        if head.as_bytes()[cut..].eq_ignore_ascii_case(mark.as_bytes())
            && head.as_bytes()[..cut]
                .last()
                .is_some_and(|&c| c.is_ascii_digit() || matches!(c, b' ' | b';' | b','))
        {
            return head[..cut].trim_end_matches([' ', ';', ',']);
        }
    }
    v
}

fn ssn_like(v: &str) -> bool {
    let d: Vec<u8> = v.bytes().filter(u8::is_ascii_digit).collect();
    d.len() == 9
        && v.bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b' ' | b'-'))
        && &d[..3] != b"000"
        && &d[..3] != b"666"
        && d[0] != b'9'
}

fn address_like(v: &str) -> bool {
    let n = v.chars().count();
    (6..=160).contains(&n)
        && !v.contains('@')
        && !v.contains("://")
        && !v.contains('<')
        && (digits(v) > 0 || v.chars().filter(|&c| is_cjk(c)).count() >= 4)
        && v.chars().filter(|c| c.is_alphabetic()).count() >= 3
}

/// Shields the value `v` (at byte `base`) of a place or organisation key from the name
/// detectors; an address there is still found.
fn place_value(out: &mut Vec<Cand>, base: usize, v: &str) {
    let (s, e) = trim_value(v);
    if e > s {
        out.push(Cand::shield(
            base + s,
            base + e,
            "field-place",
            prio::ADDRESS - 1,
        ));
    }
}

/// Emits the value `v` (at byte `base`) of a field, if it has the field's shape.
fn value(out: &mut Vec<Cand>, base: usize, v: &str, f: Field, lenient: bool, det: &'static str) {
    let (s, mut e) = trim_value(v);
    let mut val = &v[s..e];
    if f == Field::Person {
        // `Name <mail>` and `"Name" <mail>`: the name only
        if let Some(lt) = val.find('<') {
            e = s + lt;
            val = &v[s..e];
            let (s2, e2) = trim_value(val);
            let ok = name_like(&val[s2..e2], true);
            if ok {
                push(out, base + s + s2, base + s + e2, f, det);
            }
            return;
        }
    }
    // an address ends with its sentence (`… MH 43757. Please update`)
    if f == Field::Address
        && let Some(p) = val
            .match_indices(". ")
            .map(|(p, _)| p)
            .find(|&p| digits(&val[p..]) == 0)
    {
        e = s + p;
        val = &v[s..e];
    }
    let ok = match f {
        Field::Person => name_like(val, lenient),
        Field::Address => address_like(val),
        Field::Phone => phone_like(val),
        Field::Ssn => ssn_like(val),
    };
    if ok {
        push(out, base + s, base + e, f, det);
    }
}

/// The labels of form blocks in `text` (byte ranges): three or more consecutive `Label: value` lines whose labels
/// all differ and none of whose words is a listed given or family name. A chat transcript repeats its
/// speakers (`Ann: …`, `Bob: …`, `Ann: …`), and a list of people by role names them; a form's keys are
/// labels, however unknown their words (`Explicabo: Pixel 9`, `Filed: vero`).
pub(crate) fn form_labels(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if !text.contains('\n') || !(text.contains(':') || text.contains('：')) {
        return out;
    }
    // per line: its label's range, or None
    let mut block: Vec<(usize, usize)> = Vec::new();
    let flush = |block: &mut Vec<(usize, usize)>, out: &mut Vec<(usize, usize)>| {
        let distinct = block.iter().enumerate().all(|(i, &(s, e))| {
            block[..i]
                .iter()
                .all(|&(s2, e2)| text[s2..e2] != text[s..e])
        });
        let unnamed = || {
            block.iter().all(|&(s, e)| {
                text[s..e]
                    .split_whitespace()
                    .all(|w| LEX.class(&fold_key(w)) & (IN_FIRST | IN_LAST) == 0)
            })
        };
        if block.len() >= 3 && distinct && unnamed() {
            out.extend(block.iter().copied());
        }
        block.clear();
    };
    let mut ls = 0;
    for l in text.split('\n') {
        let label = line_label(l).map(|(s, e)| (ls + s, ls + e));
        match label {
            Some(r) => block.push(r),
            None => flush(&mut block, &mut out),
        }
        ls += l.len() + 1;
    }
    flush(&mut block, &mut out);
    out
}

/// `Label: value` (or `：`): the label's range in `l`, after leading blanks and list marks; at most three words,
/// no digits.
fn line_label(l: &str) -> Option<(usize, usize)> {
    let s = l.len() - l.trim_start_matches([' ', '\t', '-', '*']).len();
    let rest = &l[s..];
    let end = rest.find([':', '：'])?;
    let label = &rest[..end];
    let ok = !label.is_empty()
        && label.split_whitespace().count() <= 3
        && !label
            .chars()
            .any(|c| c.is_ascii_digit() || matches!(c, '"' | '<' | '>' | '[' | '/'))
        && label.chars().next().is_some_and(char::is_alphabetic);
    ok.then_some((s, s + end))
}

/// Entry point: every layout cue over `text` (byte offsets).
pub(crate) fn detect(text: &str, out: &mut Vec<Cand>) {
    let b = text.as_bytes();
    // Every cue needs a separator, a delimiter or a line break; chat one-liners skip it all.
    if !b
        .iter()
        .any(|&c| matches!(c, b':' | b'=' | b'\n' | b'\t' | b'|' | b';' | b','))
        && !text.contains('：')
    {
        // `Тел. 8 (808) 142-37-12`, `Address - 12 Oak Road`: keys without a colon
        if !text.contains('\n')
            && (dash_sep(text, 0).is_some() || phone_key_space(text, 0).is_some())
        {
            key_value_line(0, text, out);
        }
        cjk_addresses(text, out);
        return;
    }
    json_pairs(text, out);
    let lines: Vec<(usize, &str)> = {
        let mut v = Vec::new();
        let mut s = 0;
        for l in text.split('\n') {
            v.push((s, l));
            s += l.len() + 1;
        }
        v
    };
    let transcript = std::cell::OnceCell::new();
    let transcript = || *transcript.get_or_init(|| is_transcript(text));
    for &(ls, l) in &lines {
        key_value_line(ls, l, out);
        speaker(ls, l, out, &transcript);
    }
    tables(&lines, out);
    signatures(&lines, out);
    address_cues(text, out);
    sql_inserts(text, out);
    cjk_addresses(text, out);
}

/// `"key": "value"` pairs anywhere (JSON on one line or many).
fn json_pairs(text: &str, out: &mut Vec<Cand>) {
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(off) = memchr_pair(&b[i..]) {
        let q = i + off; // position of the closing quote of the key
        i = q + 2;
        let ks = match text[..q].rfind('"') {
            Some(p) => p + 1,
            None => continue,
        };
        let key = &text[ks..q];
        let f = match field_of(key, false) {
            Some(f) => f,
            None => continue,
        };
        let mut j = q + 2;
        while j < b.len() && b[j] == b' ' {
            j += 1;
        }
        if j >= b.len() || b[j] != b'"' {
            continue;
        }
        let vs = j + 1;
        let mut ve = vs;
        while ve < b.len() && b[ve] != b'"' && b[ve] != b'\n' {
            if b[ve] == b'\\' {
                ve += 1;
            }
            ve += 1;
        }
        if ve > b.len() {
            continue;
        }
        value(out, vs, &text[vs..ve], f, true, "field-json");
    }
}

fn memchr_pair(b: &[u8]) -> Option<usize> {
    static KEY_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\":"));
    KEY_END.find(b)
}

/// `Key: value`, `key = value`, `- key: value`, `git config user.name "value"`.
fn key_value_line(ls: usize, l: &str, out: &mut Vec<Cand>) {
    let b = l.as_bytes();
    let mut s = 0;
    while s < b.len() && matches!(b[s], b' ' | b'\t' | b'-' | b'*' | b'>' | b'#') {
        s += 1;
    }
    // `git config --global user.name "Name"`
    static GIT_NAME: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(".name "));
    if let Some(p) = GIT_NAME.find(b) {
        let v = &l[p + 6..];
        if v.starts_with('"') || v.starts_with('\'') {
            value(out, ls + p + 6, v, Field::Person, true, "field-kv");
        }
    }
    // `ADR;TYPE=home:…`, `TEL;TYPE=cell:…`: a vCard property, its parameters after `;`, its value after `:`
    if let Some((key, colon)) = vcard_property(&l[s..]) {
        if let Some(f) = field_of_norm(&NormKey::of(key), false) {
            value(
                out,
                ls + s + colon + 1,
                &l[s + colon + 1..],
                f,
                true,
                "field-kv",
            );
        }
        return;
    }
    let ascii_sep = b[s..]
        .iter()
        .position(|&c| matches!(c, b':' | b'=' | b'\t'))
        .map(|p| s + p);
    // `氏名：佐藤花子`: forms in CJK scripts write the full-width colon
    let wide_sep = l[s..].find('：').map(|p| s + p);
    let (sep, sep_len, colon) = match (ascii_sep, wide_sep) {
        (Some(a), Some(w)) if w < a => (w, '：'.len_utf8(), true),
        (None, Some(w)) => (w, '：'.len_utf8(), true),
        (Some(a), _) => (a, 1, b[a] == b':'),
        (None, None) => match dash_sep(l, s).or_else(|| phone_key_space(l, s)) {
            Some((d, n)) => (d, n, false),
            None => return,
        },
    };
    let key = l[s..sep].trim_end();
    if key.is_empty() || key.len() > 40 || key.contains('"') || key.split_whitespace().count() > 3 {
        return;
    }
    let header = s == 0 && colon;
    let nk = NormKey::of(key);
    let f = field_of_norm(&nk, header);
    // The key itself is a label, never a name (`Signed-off-by:`, `DOB:`, `SystemError:`).
    let camel = !key.contains(' ') && key.chars().skip(1).any(char::is_uppercase);
    if colon && (f.is_some() || nk.lists() & K_LABEL != 0 || camel) {
        out.push(Cand::shield(
            ls + s,
            ls + sep,
            "field-key",
            prio::ADDRESS + 5,
        ));
    }
    let Some(f) = f else {
        if nk.lists() & K_PLACE != 0 && b[sep] != b'\t' {
            place_value(out, ls + sep + sep_len, &l[sep + sep_len..]);
        }
        return;
    };
    let vs = sep + sep_len + usize::from(b[sep] == b':' && b.get(sep + 1) == Some(&b':'));
    if vs >= b.len() {
        return;
    }
    let v = &l[vs..];
    // a header's value may list several `Name <mail>`; only the first is taken as a name
    value(out, ls + vs, v, f, true, "field-kv");
}

/// The word `address` in the languages of [`ADDRESS_KEYS`], as written inside a sentence.
const ADDRESS_CUES: &[&str] = &[
    "address",
    "adresse",
    "dirección",
    "direccion",
    "endereço",
    "indirizzo",
    "anschrift",
    "adres",
    "adresa",
    "aadress",
    "osoite",
    "адрес",
    "адреса",
    "διεύθυνση",
    "მისამართი",
    "հասցե",
    "ที่อยู่",
    "주소",
    "住所",
    "地址",
];

/// Phrases after which a sentence gives where someone lives or where a parcel goes (`I live at 12 Oak Road`,
/// `shipped to Ann Lee (12 Oak Road, Leeds)`), in several languages.
#[rustfmt::skip]
const ADDRESS_PHRASES: &[&str] = &[
    "live at", "lives at", "living at", "send the parcel to", "send the package to", "send it to", "ship it to",
    "shipped to", "deliver it to", "delivered to", "meet me at", "envíen el paquete a", "vivo en", "wohne in",
    "j'habite", "j'habite au", "moro em", "moro na", "abito in", "woon op", "asun osoitteessa", "живу по адресу",
];

/// Words before `address` that make it another kind of address.
const NOT_POSTAL: &[&str] = &[
    "ip",
    "mac",
    "email",
    "e-mail",
    "mail",
    "web",
    "memory",
    "return",
    "server",
    "wallet",
    "bitcoin",
    "hardware",
    "physical",
    "virtual",
    "ipv4",
    "ipv6",
    "network",
    "broadcast",
    "gateway",
    "url",
    "base",
    "bind",
    "listen",
    "loopback",
    "multicast",
    "contract",
    "the",
    "this",
    "that",
    "an",
    "ethernet",
];

/// `this is Ann Lee — address 12 Oak Road, Leeds`, `저는 … — 주소 부산광역시 …`: the cue word inside a line, then
/// the address to the line's end. It needs a digit, and opens with a number, a capital, a letter of a script
/// without case or an abbreviation (`пр. Крылова`), so that `address of the form` or `IP address 10.0.0.1`
/// are left alone.
fn address_cues(text: &str, out: &mut Vec<Cand>) {
    // In ASCII text a cue holds one of these (in lower or upper case): one vectorised search spares most texts
    // the cue automaton.
    static ASCII_PARTS: LazyLock<aho_corasick::AhoCorasick> = LazyLock::new(|| {
        aho_corasick::AhoCorasick::new([
            "dres",
            "DRES",
            "irec",
            "IREC",
            "ndiriz",
            "NDIRIZ",
            "schrift",
            "SCHRIFT",
            "soite",
            "SOITE",
            "ive at",
            "ving at",
            "IVE AT",
            "parcel",
            "ackage to",
            "it to",
            "pped to",
            "PPED TO",
            "ivered to",
            "eet me",
            "vivo",
            "Vivo",
            "ohne in",
            "habite",
            "oro em",
            "oro na",
            "bito in",
            "oon op",
        ])
        // constant short literals: building cannot fail
        .expect("constant cue parts")
    });
    let b = text.as_bytes();
    if !b.iter().any(u8::is_ascii_digit) || text.is_ascii() && !ASCII_PARTS.is_match(b) {
        return;
    }
    static CUES: LazyLock<aho_corasick::AhoCorasick> = LazyLock::new(|| {
        aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(ADDRESS_CUES.iter().chain(ADDRESS_PHRASES))
            // constant short literals: building cannot fail
            .expect("constant address cues")
    });
    for m in CUES.find_iter(text) {
        let (s, e) = (m.start(), m.end());
        let phrase = m.pattern().as_usize() >= ADDRESS_CUES.len();
        let glued = |c: char| c.is_alphanumeric() || c == '_' || c == '-' || c == '@';
        if text[..s].chars().next_back().is_some_and(glued)
            || text[e..]
                .chars()
                .next()
                .is_some_and(|c| glued(c) || c == ':')
        {
            continue;
        }
        // inside a sentence, after another word: a key at a line's start is `key_value_line`'s
        let line_start = text[..s].rfind('\n').map_or(0, |i| i + 1);
        let before = text[line_start..s].trim_end_matches([' ', '—', '–', '-', ',']);
        let prev = before.rsplit(' ').next().unwrap_or("").to_lowercase();
        if !phrase && before.trim().is_empty() || NOT_POSTAL.contains(&prev.as_str()) {
            continue;
        }
        let line_end = text[e..].find('\n').map_or(text.len(), |i| e + i);
        let mut e = e;
        let mut v = &text[e..line_end];
        let mut bracketed = false;
        // `shipped to Ann Lee (12 Oak Road, Leeds)`: the address in the brackets after the name
        if phrase && let Some(o) = v.find(" (") {
            let name = v[..o].trim();
            if name.split(' ').count() <= 5
                && name.starts_with(|c: char| c.is_uppercase() || uncased_letter(c))
                && let Some(close) = v[o..].find(')').map(|c| o + c)
            {
                v = &text[e + o + 2..e + close];
                e += o + 2;
                bracketed = true;
            }
        }
        let (vs, ve) = trim_value(v);
        let mut val = v[vs..ve].trim_end_matches(['.', ';', '?', '!']);
        // after a phrase the sentence may go on (`… 28013 Madrid tomorrow`): not its lower-case words
        if phrase && !bracketed {
            while let Some((head, last)) = val.rsplit_once(' ')
                && last.starts_with(|c: char| c.is_lowercase())
            {
                val = head.trim_end_matches([',', ' ']);
            }
        }
        let Some(first) = val.split(' ').next() else {
            continue;
        };
        let opens = first
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c.is_uppercase() || uncased_letter(c))
            || first.ends_with('.') && first.chars().count() <= 4;
        if !opens
            || vs == 0 && !bracketed
            || val.len() > 160
            || val.split(' ').count() < 2
            || !val.bytes().any(|c| c.is_ascii_digit())
            || val.contains(['@', '\\', '='])
            || val.contains("://")
            || b.get(e) != Some(&b' ') && !bracketed
        {
            continue;
        }
        push(
            out,
            e + vs,
            e + vs + val.len(),
            Field::Address,
            "address-cue",
        );
    }
}

/// `INSERT INTO t (name, street) VALUES ('Ann Lee', '12 Oak Road'), (…)`: each quoted value under a column
/// whose name is a field's key.
fn sql_inserts(text: &str, out: &mut Vec<Cand>) {
    static VALUES: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("VALUES"));
    static VALUES_LOWER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("values"));
    let b = text.as_bytes();
    for v in VALUES.find_iter(b).chain(VALUES_LOWER.find_iter(b)) {
        // the column list: the last `( … )` before `VALUES`
        let head = text[..v].trim_end();
        let Some(cols) = head
            .strip_suffix(')')
            .and_then(|h| h.rfind('(').map(|o| &h[o + 1..]))
        else {
            continue;
        };
        if cols.len() > 400 || cols.contains(['\'', '"', '\n']) {
            continue;
        }
        let fields: Vec<Option<Field>> = cols
            .split(',')
            .map(|c| field_of_norm(&NormKey::of(c.trim().trim_matches('`')), false))
            .collect();
        if fields.iter().all(Option::is_none) {
            continue;
        }
        // the tuples: `(`, quoted or bare values split at commas outside quotes, `)`, then `,` or the end
        let mut i = v + "VALUES".len();
        loop {
            while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\t' | b',') {
                i += 1;
            }
            if b.get(i) != Some(&b'(') {
                break;
            }
            i += 1;
            let mut col = 0;
            loop {
                while i < b.len() && b[i] == b' ' {
                    i += 1;
                }
                if b.get(i) == Some(&b'\'') {
                    let s = i + 1;
                    let mut e = s;
                    // `''` is a quote inside the value
                    while e < b.len() && (b[e] != b'\'' || b.get(e + 1) == Some(&b'\'')) {
                        e += if b[e] == b'\'' { 2 } else { 1 };
                    }
                    if e >= b.len() {
                        return;
                    }
                    if let Some(Some(f)) = fields.get(col) {
                        value(out, s, &text[s..e], *f, true, "sql-values");
                    }
                    i = e + 1;
                } else {
                    while i < b.len() && !matches!(b[i], b',' | b')') {
                        i += 1;
                    }
                }
                while i < b.len() && b[i] == b' ' {
                    i += 1;
                }
                match b.get(i) {
                    Some(b',') => {
                        i += 1;
                        col += 1;
                    }
                    Some(b')') => {
                        i += 1;
                        break;
                    }
                    _ => return,
                }
            }
        }
    }
}

/// A vCard property line with parameters (`ADR;TYPE=home:`): its name and the offset of the colon.
fn vcard_property(l: &str) -> Option<(&str, usize)> {
    let semi = l.find(';')?;
    let name = &l[..semi];
    if name.is_empty()
        || name.len() > 12
        || !name.bytes().all(|c| c.is_ascii_uppercase() || c == b'-')
    {
        return None;
    }
    let colon = semi + l[semi..].find(':')?;
    // parameters are `KEY=value` lists: no spaces before the colon
    (!l[semi..colon].contains(' ')).then_some((name, colon))
}

/// `Address - 12 Oak Road`, `Name – Ann Lee`: a known field's key, then a dash between spaces (the dash's
/// offset and length). Unknown keys are left alone: a dash between words is mostly prose.
fn dash_sep(l: &str, s: usize) -> Option<(usize, usize)> {
    let b = l.as_bytes();
    // a key is short: only the line's head is searched, for `-` or the lead byte of `–` and `—`
    let end = l.len().min(s + 48);
    let mut i = s;
    // a three-byte dash may end past the head
    while i < end
        && let Some(off) = memchr::memchr2(b'-', 0xE2, &b[i..end])
    {
        let d = i + off;
        let len = match &b[d..] {
            [b'-', ..] => 1,
            [0xE2, 0x80, 0x93 | 0x94, ..] => 3,
            _ => {
                i = d + 1;
                continue;
            }
        };
        if d > s && b[d - 1] == b' ' && b.get(d + len) == Some(&b' ') {
            let key = &l[s..d - 1];
            return (key.split_whitespace().count() <= 3
                && field_of_norm(&NormKey::of(key), false).is_some())
            .then_some((d, len));
        }
        i = d + len;
    }
    None
}

/// `Тел. 8 (808) 142-37-12`, `Phone 6465.1803`, `โทร 0984968480`: a phone key, a space, then a number (the
/// space's offset and length). Only phone keys: after other words a number is a count, a year or a price.
fn phone_key_space(l: &str, s: usize) -> Option<(usize, usize)> {
    let sp = s + memchr::memchr(b' ', &l.as_bytes()[s..l.len().min(s + 24)])?;
    let value = l[sp..].trim_start();
    (value.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '(')
        && field_of_norm(&NormKey::of(&l[s..sp]), false) == Some(Field::Phone))
    .then_some((sp, 1))
}

/// Chat speaker labels: `[10:42] <Name> …`, `12/03/25, 10:42 - Name: …`, `Name: …`,
/// `> Name wrote:`.
fn speaker(ls: usize, l: &str, out: &mut Vec<Cand>, transcript: &dyn Fn() -> bool) {
    let b = l.as_bytes();
    let mut s = 0;
    while s < b.len() && matches!(b[s], b'>' | b' ') {
        s += 1;
    }
    // a leading time stamp: `[10:42]`, `12/03/25, 10:42 -`
    if b.get(s) == Some(&b'[') {
        if let Some(p) = l[s..].find(']') {
            s += p + 1;
        }
    } else if b.get(s).is_some_and(u8::is_ascii_digit)
        && let Some(p) = l[s..].find(" - ")
        && p < 24
        && l[s..s + p]
            .bytes()
            .all(|c| c.is_ascii_digit() || b"/.,: -APMapm".contains(&c))
    {
        s += p + 3;
    }
    while s < b.len() && b[s] == b' ' {
        s += 1;
    }
    if b.get(s) == Some(&b'<') {
        if let Some(p) = l[s..].find('>') {
            let nick = &l[s + 1..s + p];
            if name_like(nick, false) && nick.split(' ').count() <= 3 {
                push(out, ls + s + 1, ls + s + p, Field::Person, "speaker");
            }
        }
        return;
    }
    let rest = &l[s..];
    // Every cue below ends at a colon; most lines have none.
    let Some(first_colon) = memchr::memchr(b':', rest.as_bytes()) else {
        return;
    };
    // `Name wrote:` / `Name schrieb:` / `Name a écrit :`: the first of each verb, in this order
    for w in [
        " wrote:",
        " schrieb:",
        " a écrit :",
        " escribió:",
        " ha scritto:",
        " написал:",
    ] {
        let found = memchr::memchr_iter(b':', &rest.as_bytes()[first_colon..])
            .map(|c| first_colon + c + 1)
            .find(|&end| rest.as_bytes()[..end].ends_with(w.as_bytes()));
        if let Some(p) = found.map(|end| end - w.len()) {
            let mut ns = 0;
            if let Some(c) = rest[..p].rfind(", ") {
                ns = c + 2;
            }
            let name = &rest[ns..p];
            if name_like(name, true) {
                push(out, ls + s + ns, ls + s + p, Field::Person, "speaker");
            }
            return;
        }
    }
    // the first `: ` (its colon is at or after the first colon)
    let colon_space = memchr::memchr_iter(b':', &rest.as_bytes()[first_colon..])
        .map(|c| first_colon + c)
        .find(|&c| rest.as_bytes().get(c + 1) == Some(&b' '));
    if let Some(p) = colon_space {
        let name = &rest[..p];
        if p > 0
            && (s > 0 || utterance_like(&rest[p + 1..]) || transcript())
            && name.split(' ').count() <= 3
            && field_of(name, true).is_none()
            && name_like(name, false)
        {
            push(out, ls + s, ls + s + p, Field::Person, "speaker");
        }
    }
}

/// Whether some line of `text` is `Name: something said`: then its other `Name: yes` lines are speakers too.
pub(super) fn is_transcript(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start_matches(['>', ' ']);
        l.find(": ").is_some_and(|p| {
            let name = &l[..p];
            // `Note: the flag is deprecated.`, `PS: …`: a label over prose makes no transcript
            (1..=3).contains(&name.split(' ').count())
                && name_like(name, false)
                && (name.chars().any(char::is_lowercase) || !name.chars().any(char::is_uppercase))
                && field_of(name, true).is_none()
                && utterance_like(&l[p + 1..])
        })
    })
}

/// Whether what follows a bare `Name:` reads as something said rather than a form value (`n/a`, `—`, a
/// date, a count, one word, a product name): a sentence's end, a few words one of which is not capitalised,
/// or a run of letters of a script without case.
/// A speaker cut short here is still found from another of their lines, or by the name detectors.
pub(super) fn utterance_like(v: &str) -> bool {
    let v = v.trim();
    if v.ends_with(['.', '!', '?', '…', '。', '！', '？']) && v.chars().any(char::is_alphabetic)
    {
        return true;
    }
    // scripts without case or spaces (`明日行きます`): length alone
    if v.chars().filter(|&c| uncased_letter(c)).count() >= 4 {
        return true;
    }
    let words: SmallVec<[&str; 8]> = v.split_whitespace().take(8).collect();
    words.len() >= 2
        && words
            .iter()
            .any(|w| w.chars().next().is_some_and(char::is_lowercase))
}

/// Splits a delimited line into cell ranges, honouring double quotes.
fn cells(l: &str, d: u8) -> Vec<(usize, usize)> {
    cell_iter(l, d).collect()
}

/// [`cells`] without collecting them.
fn cell_iter(l: &str, d: u8) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = l.as_bytes();
    let mut s = 0;
    let mut i = 0;
    let mut q = false;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while i < b.len() {
            let c = b[i];
            i += 1;
            if c == b'"' {
                q = !q;
            } else if c == d && !q {
                let cell = (s, i - 1);
                s = i;
                return Some(cell);
            }
        }
        done = true;
        Some((s, b.len()))
    })
}

/// Table rows under a header that names their columns.
fn tables(lines: &[(usize, &str)], out: &mut Vec<Cand>) {
    let mut i = 0;
    while i < lines.len() {
        let (_, h) = lines[i];
        i += 1;
        let d = match [b'\t', b'|', b';', b',']
            .into_iter()
            .find(|&d| memchr::memchr(d, h.as_bytes()).is_some())
        {
            Some(d) => d,
            None => continue,
        };
        // a header cell is a short label without digits other than a suffix
        let header_field = |(s, e): (usize, usize)| {
            let c = h[s..e].trim().trim_matches('"');
            if c.len() > 32 || c.starts_with(|ch: char| ch.is_ascii_digit()) {
                None
            } else {
                field_of(c, false)
            }
        };
        // Most delimited lines are prose with a comma: no cell names a field, and nothing is
        // collected for them.
        if !cell_iter(h, d).any(|c| header_field(c).is_some()) {
            continue;
        }
        let hc = cells(h, d);
        if hc.len() < 2 {
            continue;
        }
        let fields: Vec<Option<Field>> = hc.iter().map(|&c| header_field(c)).collect();
        let places: Vec<bool> = hc
            .iter()
            .map(|&(s, e)| NormKey::of(h[s..e].trim().trim_matches('"')).lists() & K_PLACE != 0)
            .collect();
        if fields.iter().all(Option::is_none)
            || hc.iter().any(|&(s, e)| {
                let c = h[s..e].trim();
                c.contains('@') || c.split_whitespace().count() > 3
            })
        {
            continue;
        }
        while i < lines.len() {
            let (ls, l) = lines[i];
            if l.trim().is_empty() {
                break;
            }
            i += 1;
            let rc = cells(l, d);
            if rc.len() != hc.len() {
                if l.trim_start().starts_with("|-") || l.trim_start().starts_with("|:") {
                    continue;
                }
                break;
            }
            for (k, &(s, e)) in rc.iter().enumerate() {
                if let Some(f) = fields[k] {
                    value(out, ls + s, &l[s..e], f, true, "field-table");
                } else if places[k] {
                    place_value(out, ls + s, &l[s..e]);
                }
            }
        }
    }
}

/// Closing phrases after which a signature's name (and maybe address) follows.
const VALEDICTIONS: &[&str] = &[
    "best",
    "best regards",
    "kind regards",
    "regards",
    "warm regards",
    "cheers",
    "thanks",
    "thank you",
    "many thanks",
    "thanks again",
    "sincerely",
    "yours sincerely",
    "sincerely yours",
    "yours faithfully",
    "yours truly",
    "best wishes",
    "all the best",
    "take care",
    "respectfully",
    "mit freundlichen grussen",
    "freundliche grusse",
    "viele grusse",
    "beste grusse",
    "liebe grusse",
    "herzliche grusse",
    "gruss",
    "grusse",
    "lg",
    "mfg",
    "vg",
    "cordialement",
    "bien cordialement",
    "salutations",
    "bien a vous",
    "amicalement",
    "saludos",
    "un saludo",
    "atentamente",
    "saludos cordiales",
    "cordiali saluti",
    "distinti saluti",
    "saluti",
    "met vriendelijke groet",
    "vriendelijke groeten",
    "groeten",
    "groetjes",
    "med venlig hilsen",
    "venlig hilsen",
    "mvh",
    "hilsen",
    "med vanlig halsning",
    "med vanliga halsningar",
    "vanliga halsningar",
    "halsningar",
    "med vennlig hilsen",
    "vennlig hilsen",
    "ystavallisin terveisin",
    "terveisin",
    "с уважением",
    "з повагою",
    "pozdrawiam",
    "z powazaniem",
    "s pozdravem",
    "s pozdravom",
    "srdecne",
    "udvozlettel",
    "tisztelettel",
    "saygilarimla",
    "saygilar",
    "atenciosamente",
    "abracos",
    "cumprimentos",
    "cu stima",
    "srdacan pozdrav",
    "lijep pozdrav",
    "με εκτιμηση",
    "φιλικα",
    "敬具",
    "草々",
    "よろしくお願いします",
    "よろしくお願いいたします",
    "此致",
    "此致敬礼",
    "谢谢",
    "감사합니다",
    "드림",
];

/// Drops the people that are two or more everyday words alone on the line after a closing
/// (`Met vriendelijke groet,` / `Wakker Begin`): each word among the most frequent of some language
/// and none a listed name. A real signature has a family name, which such lists seldom hold.
pub(super) fn drop_everyday_signatures(text: &str, cands: &mut Vec<Cand>) {
    let everyday = |w: &str| {
        LEX.class(&fold_key(w)) & (IN_FIRST | IN_LAST) == 0 && super::lexicon::frequent_word(w)
    };
    cands.retain(|c| {
        if c.ty != Some(PiiType::Person) {
            return true;
        }
        // alone at the start of a line: only blanks back to a line break (a look back to the
        // line's start from every name of a long line would make a long text quadratic)
        let head = text[..c.start].trim_end_matches([' ', '\t']);
        let Some(before) = head.strip_suffix('\n') else {
            return true;
        };
        let words: SmallVec<[&str; 4]> = text[c.start..c.end].split_whitespace().collect();
        if words.len() < 2 || !words.iter().all(|w| everyday(w)) {
            return true;
        }
        let prev = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
        !is_valediction(prev)
    });
}

pub(super) fn is_valediction(l: &str) -> bool {
    static SET: LazyLock<StaticSet> = LazyLock::new(|| VALEDICTIONS.iter().copied().collect());
    let t = l
        .trim()
        .trim_end_matches([',', '!', '.', '、', '，'])
        .trim();
    t.len() <= 40 && !t.is_empty() && SET.contains(fold_key(t).as_str())
}

/// A line that carries a phone, a mail or a link: ends an address block.
fn contact_line(l: &str) -> bool {
    let t = l.trim();
    let low = t.to_lowercase();
    t.contains('@')
        || t.contains("://")
        || t.starts_with("www.")
        || [
            "tel", "phone", "fax", "mob", "cell", "t:", "m:", "e:", "telefon", "тел",
        ]
        .iter()
        .any(|p| low.starts_with(p))
        || (digits(t) >= 7
            && !t.contains(',')
            && t.chars().filter(|c| c.is_alphabetic()).count() <= 4)
}

/// Keys of a recipient block (`Bill to: Name`, then the address lines), normalised.
const RECIPIENT_KEYS: &[&str] = &[
    "billto",
    "shipto",
    "deliverto",
    "sendto",
    "soldto",
    "invoiceto",
    "attn",
    "attention",
    "lieferadresse",
    "rechnungsadresse",
    "empfanger",
    "destinataire",
    "destinatario",
    "facturara",
    "enviara",
];

/// Where the value of a recipient key's line starts (`Bill to: Dionýz` gives the offset of `Dionýz`).
/// `SHIP TO:` alone on its line: the name and the address follow on the next lines.
fn recipient_key_only(l: &str) -> bool {
    l.trim_end()
        .strip_suffix(':')
        .is_some_and(|k| k.len() <= 24 && RECIPIENT_KEYS.contains(&NormKey::of(k).as_str()))
}

fn recipient_value(l: &str) -> Option<usize> {
    let c = l.find(':')?;
    RECIPIENT_KEYS
        .contains(&NormKey::of(&l[..c]).as_str())
        .then_some(c + 1)
        .filter(|&v| !l[v..].trim().is_empty())
}

/// The name line, then the address lines, of a signature, a letter's head or a recipient block.
fn signatures(lines: &[(usize, &str)], out: &mut Vec<Cand>) {
    let mut k = 0;
    while k < lines.len() {
        let head = k == 0;
        let after_closing = is_valediction(lines[k].1);
        let recipient = recipient_value(lines[k].1);
        let bare_recipient = recipient.is_none() && recipient_key_only(lines[k].1);
        k += 1;
        if !(head || after_closing || recipient.is_some() || bare_recipient) {
            continue;
        }
        // the name: the next line (the line itself at a letter's head; its value in a recipient block)
        let n = if recipient.is_some() || head && !after_closing && !bare_recipient {
            k - 1
        } else {
            match (k..lines.len().min(k + 2)).find(|&j| !lines[j].1.trim().is_empty()) {
                Some(j) => j,
                None => continue,
            }
        };
        let (ns, nl) = lines[n];
        let from = recipient.unwrap_or(0);
        let (ns, nl) = (ns + from, &nl[from..]);
        let (s, e) = trim_value(nl);
        // common words alone sign for a team (`Kind regards,\nSupport`, `Best,\nThe Team`), not a person
        if !name_like(&nl[s..e], false) || nl[s..e].split_whitespace().count() > 4 {
            continue;
        }
        // the address: the lines after the name, up to a blank or contact line
        let mut j = n + 1;
        let mut last = None;
        let mut digit = false;
        while j < lines.len() && j <= n + 5 {
            let l = lines[j].1;
            if l.trim().is_empty() || contact_line(l) || l.trim().chars().count() > 80 {
                break;
            }
            digit |= digits(l) > 0;
            last = Some(j);
            j += 1;
        }
        let addr = last.filter(|_| digit).map(|lj| {
            let (a, al) = lines[n + 1];
            let (zs, zl) = lines[lj];
            let (s1, _) = trim_value(al);
            let (_, e2) = trim_value(zl);
            (a + s1, zs + e2)
        });
        // A recipient's address is two lines or more, or one of three words or more (`Net 30` is a payment
        // term).
        let addr = addr.filter(|&(a, z)| {
            recipient.is_none() && !bare_recipient
                || last.is_some_and(|lj| lj > n + 1)
                || z - a >= 8 && lines[n + 1].1.split_whitespace().count() >= 3
        });
        // at a letter's head and in a recipient block the address lines are what make the line a name
        if (recipient.is_some() || bare_recipient || head && !after_closing) && addr.is_none() {
            continue;
        }
        push(out, ns + s, ns + e, Field::Person, "signature");
        if let Some((a, z)) = addr {
            push(out, a, z, Field::Address, "signature");
        }
        k = j.max(k);
    }
}

/// Administrative markers of CJK and Hangul addresses.
const CJK_MARKERS: &[&str] = &[
    "省", "県", "都", "府", "道", "市", "区", "區", "县", "縣", "郡", "町", "村", "丁目", "番地",
    "番", "号", "號", "路", "街", "巷", "弄", "座", "楼", "樓", "室", "시", "도", "구", "군", "로",
    "길", "동", "읍", "면", "리", "층", "호",
];

/// Runs of CJK or Hangul text with digits and at least two administrative markers.
fn cjk_addresses(text: &str, out: &mut Vec<Cand>) {
    if text.is_ascii() {
        return;
    }
    let mut it = text.char_indices().peekable();
    while let Some((s, c)) = it.next() {
        if !is_cjk(c) {
            continue;
        }
        let mut e = s + c.len_utf8();
        let mut prev_cjk = true;
        while let Some(&(i, ch)) = it.peek() {
            let next_ok = |t: &str| {
                t.chars()
                    .nth(1)
                    .is_some_and(|n| is_cjk(n) || n.is_ascii_digit())
            };
            let ok = is_cjk(ch)
                || ch.is_ascii_digit()
                || matches!(ch, '-' | '－' | '−' | 'ー' | '〒')
                || ('０'..='９').contains(&ch)
                || (ch.is_ascii_alphabetic() && prev_cjk)
                || (matches!(ch, ' ' | '\u{3000}') && next_ok(&text[i..]));
            if !ok {
                break;
            }
            prev_cjk = is_cjk(ch);
            e = i + ch.len_utf8();
            it.next();
        }
        let run = &text[s..e];
        let markers = CJK_MARKERS.iter().filter(|m| run.contains(**m)).count();
        let has_digit = run
            .chars()
            .any(|c| c.is_ascii_digit() || ('０'..='９').contains(&c));
        let hangul_only = run
            .chars()
            .all(|c| !is_cjk(c) || ('\u{AC00}'..='\u{D7AF}').contains(&c));
        let need = if hangul_only { 3 } else { 2 };
        if markers >= need && has_digit && run.chars().count() >= 8 {
            push(out, s, e, Field::Address, "cjk-address");
        }
    }
}
