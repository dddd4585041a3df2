//! The redactor on layouts and scripts its word lists never saw (issue 37): values found by
//! their field, column, header, speaker label or signature, and look-alikes left alone.

use hearth::curate::redact::{PiiType, RedactConfig, Redactor};

fn found(text: &str) -> Vec<(String, PiiType)> {
    let r = Redactor::new(RedactConfig::default());
    r.find(text)
        .into_iter()
        .map(|s| {
            (
                text.chars().skip(s.start).take(s.end - s.start).collect(),
                s.pii_type,
            )
        })
        .collect()
}

fn has(text: &str, value: &str, t: PiiType) {
    let f = found(text);
    assert!(
        f.iter().any(|(v, ty)| v == value && *ty == t),
        "{value:?} as {t:?} in {text:?}: {f:?}"
    );
}

/// `text` holds no span of type `t`.
fn lacks(text: &str, t: PiiType) {
    let f = found(text);
    assert!(
        !f.iter().any(|(_, ty)| *ty == t),
        "{text:?} has a {t:?}: {f:?}"
    );
}

#[test]
fn names_in_other_scripts_by_field_and_column() {
    has(
        "{\"owner\": 1, \"contactName\": \"金子 健太\"}",
        "金子 健太",
        PiiType::Person,
    );
    has(
        "uid;vorname;nachname\n7;Örjan;Şahin\n",
        "Örjan",
        PiiType::Person,
    );
    has(
        "uid;vorname;nachname\n7;Örjan;Şahin\n",
        "Şahin",
        PiiType::Person,
    );
    has(
        "[user]\n    name = Пётр Сидоренко\n",
        "Пётр Сидоренко",
        PiiType::Person,
    );
    has(
        "| id | member |\n|----|--------|\n| 4 | 박지훈 |",
        "박지훈",
        PiiType::Person,
    );
}

#[test]
fn names_in_headers_and_chat_labels() {
    has(
        "From: \"Ilse Vandersteen\" <ilse@example.org>\nSubject: hi",
        "Ilse Vandersteen",
        PiiType::Person,
    );
    has(
        "Author: Tomasz Wróblewski\nLicense: MIT",
        "Tomasz Wróblewski",
        PiiType::Person,
    );
    has(
        "[21:07] <Ragnhild> anyone around?",
        "Ragnhild",
        PiiType::Person,
    );
    let t = "Signed-off-by: Aino Lehtonen <aino@example.fi>";
    has(t, "Aino Lehtonen", PiiType::Person);
    assert!(
        !found(t).iter().any(|(v, _)| v.contains("Signed")),
        "{:?}",
        found(t)
    );
}

#[test]
fn address_lines_after_a_signature_and_in_cjk() {
    let t = "Kind regards,\nMatti Virtanen\nKoivukuja 7 B 12\n00940 Helsinki\n\nP.S. thanks";
    has(t, "Matti Virtanen", PiiType::Person);
    has(t, "Koivukuja 7 B 12\n00940 Helsinki", PiiType::Address);
    // Without spaces the run's edges are not found: the span may take the words around it.
    let t = "送付先は大阪府堺市北区中百舌鳥町2丁目104番地です";
    assert!(
        found(t)
            .iter()
            .any(|(v, ty)| v.contains("大阪府堺市北区中百舌鳥町2丁目104番地")
                && *ty == PiiType::Address),
        "{:?}",
        found(t)
    );
}

#[test]
fn wsl_paths_national_phones_and_bare_ssn() {
    has(
        "cd /mnt/c/Users/Ingrid/Music && ls",
        "/mnt/c/Users/Ingrid/Music",
        PiiType::FilePath,
    );
    has("ruf an: 0171/9988776", "0171/9988776", PiiType::Phone);
    has(
        "office 040/123 4567 bis 17 Uhr",
        "040/123 4567",
        PiiType::Phone,
    );
    has(
        "desk line 612 55 81 90;ext=42",
        "612 55 81 90;ext=42",
        PiiType::Phone,
    );
    has("my social is 219093321 fwiw", "219093321", PiiType::Ssn);
}

#[test]
fn look_alikes_are_left_alone() {
    for t in [
        "In-Reply-To: <20240311.8812.abc@lists.example.org>",
        "Add Reviewed-by and Acked-by trailers before merging.",
        "Vielen Dank für Ihre Bestellung, Ihr Serviceteam",
        "My rewards card 9876543210123 has no points.",
        "Traceback:\nKeyError: 'name'",
        // a date's weekday and month, each also a given name somewhere (Sat, Thu, Sun; Jan, Jul, Jun)
        "Sat Jan 27 10:16:41 2007 - server restarted",
        "Thu Jul 11 06:51:22 1985: backup done",
        "See you Sun Jun 9!",
        // places of several words, each word also a name (Sierra, Leone; Costa; San, Marino)
        "Trains to Leeds or Sierra Leone?",
        "Best museums in Costa Rica and San Marino?",
    ] {
        assert!(found(t).is_empty(), "{t:?}: {:?}", found(t));
    }
}

#[test]
fn form_labels_and_place_columns_are_no_names() {
    // a past form of an ordinary word is a form label, not a speaker
    let t = "Applicant: Ruth Okafor\nFiled: 14/02/24";
    has(t, "Ruth Okafor", PiiType::Person);
    assert!(
        !found(t).iter().any(|(v, _)| v.contains("Filed")),
        "{:?}",
        found(t)
    );
    // a speaker whose name ends like a verb form stays a name
    has("Harding: see you at six", "Harding", PiiType::Person);
    // a town column spelled like a name (`North Heather`) is a place, in a table or a field
    let t = "name;city;tel\n\"Megan Miller\";North Heather;(462) 889-7514\n";
    has(t, "Megan Miller", PiiType::Person);
    assert!(
        !found(t).iter().any(|(v, _)| v.contains("Heather")),
        "{:?}",
        found(t)
    );
    let t = "Customer: Olga Petrova\nCity: Port Sarah";
    has(t, "Olga Petrova", PiiType::Person);
    assert!(
        !found(t).iter().any(|(v, _)| v.contains("Sarah")),
        "{:?}",
        found(t)
    );
}

#[test]
fn phone_cells_keep_their_extension_and_bare_digits() {
    has(
        "id,phone\n12,387.978.9328x792",
        "387.978.9328x792",
        PiiType::Phone,
    );
    has(
        "id,name,phone\n3,Ana,4155550192",
        "4155550192",
        PiiType::Phone,
    );
    has("Tel.: 30/809 4699", "30/809 4699", PiiType::Phone);
}

#[test]
fn inline_addresses_with_floors_postcodes_and_towns_first() {
    for (t, a) in [
        // Spanish floor and door, Danish floor and side
        (
            "meet me at Calle Arenal, 21, 4º C, 28013 Madrid tomorrow",
            "Calle Arenal, 21, 4º C, 28013 Madrid",
        ),
        (
            "Is Nørrebrogade 44, 2. tv., 2200 København inside the zone?",
            "Nørrebrogade 44, 2. tv., 2200 København",
        ),
        // Italian number after a comma, postcode, province
        (
            "Is Via Garibaldi, 12, 10122, Torino (TO) ok?",
            "Via Garibaldi, 12, 10122, Torino (TO)",
        ),
        // Polish and Hungarian postcodes
        (
            "send it to ul. Długa 5/7, 80-827 Gdańsk please",
            "ul. Długa 5/7, 80-827 Gdańsk",
        ),
        (
            "Is Petőfi tér 3., H-4025 Debrecen far?",
            "Petőfi tér 3., H-4025 Debrecen",
        ),
        // Brazilian CEP and state
        (
            "meet me at Rua Aurora, 88, Centro, 01209-001 Santos / SP now",
            "Rua Aurora, 88, Centro, 01209-001 Santos / SP",
        ),
        // Russian: town first, street abbreviations, house and flat
        (
            "Is г. Тверь, просп. Ленина, д. 12, кв. 7, 170100 right?",
            "г. Тверь, просп. Ленина, д. 12, кв. 7, 170100",
        ),
        // a unit before the street, a number before its comma, a town joined to its postcode
        (
            "Please send it to Unit 12, 48 Harbour Quay, Wellington 6011 today",
            "Unit 12, 48 Harbour Quay, Wellington 6011",
        ),
        (
            "Please send it to 17, Gandhi Street, Nashik-422001 today",
            "17, Gandhi Street, Nashik-422001",
        ),
    ] {
        has(t, a, PiiType::Address);
    }
    // a number, a comma and a street name without a town is not enough on its own
    let t = "I have 2, Abbey Road is my favourite album";
    assert!(found(t).is_empty(), "{t:?}: {:?}", found(t));
}

/// Keys as people write them: Greek with its accents, Thai with its vowel and tone marks.
#[test]
fn accented_and_marked_keys_name_their_fields() {
    let t = "Όνομα: Σπυράννα\nΔιεύθυνση: Χαράσου 80, Αλεξανδρούπολη\nΤηλ: 2101234567";
    has(t, "Σπυράννα", PiiType::Person);
    has(t, "2101234567", PiiType::Phone);
    let t = "ชื่อ: จันทภา นักสำหรวจ\nที่อยู่: 48 หมู่ 2 ถนนศรีวงค์\nโทร: 081 234 5678";
    has(t, "จันทภา นักสำหรวจ", PiiType::Person);
    assert!(
        !found(t).iter().any(|(v, _)| v.starts_with("ชื่อ")),
        "{:?}",
        found(t)
    );
}

/// A form's keys are labels, however unknown their words; a transcript repeats its speakers, and a list of
/// people by role names them, so both keep their names.
#[test]
fn form_keys_are_labels_and_speakers_stay_names() {
    let t = "Explicabo: Pixel 9\nSoluta: reiciendis\nCumque: 1998-08-06\nFiled: vero";
    assert!(found(t).is_empty(), "{:?}", found(t));
    let t = "Harding: are you coming tonight?\nOkafor: yes\nHarding: great, see you";
    has(t, "Harding", PiiType::Person);
    has(t, "Okafor", PiiType::Person);
    let t = "Team:\nAnna: design\nBen: backend\nCarl: QA";
    has(t, "Anna", PiiType::Person);
    has(t, "Carl", PiiType::Person);
}

/// `Bill to: Name` then the address lines: the block names both; a payment term under it is no address, and
/// a team signing with common words (`Support`, `The Team`) is no person.
#[test]
fn recipient_blocks_and_team_signatures() {
    let t = "INVOICE #5094\nBill to: Dionýz Kováč\nRepíková 5\n886 86 Liptovské Revúce";
    has(t, "Dionýz Kováč", PiiType::Person);
    has(t, "Repíková 5\n886 86 Liptovské Revúce", PiiType::Address);
    let t = "Ship to: Margit Hansen\nVesterbrogade 12, 1620 København V\n\nThanks!";
    has(t, "Vesterbrogade 12, 1620 København V", PiiType::Address);
    let t = "Bill to: ACME Ltd\nNet 30";
    assert!(
        !found(t).iter().any(|(_, ty)| *ty == PiiType::Address),
        "{:?}",
        found(t)
    );
    for t in [
        "Kind regards,\nSupport",
        "Best,\nThe Team",
        "Viele Grüße,\nKundenservice",
        "Cordialement,\nÉquipe",
        "Saludos,\nEquipo",
    ] {
        assert!(found(t).is_empty(), "{t:?}: {:?}", found(t));
    }
    has("Kind regards,\nHarding", "Harding", PiiType::Person);
}

/// A form of two fields is no transcript: a key over `n/a`, `—`, one word or a product is a label.
#[test]
fn short_forms_are_not_speakers() {
    for t in [
        "Sequi: —\nVel: n/a",
        "Nemo: pariatur\nExercitationem: Steam Deck",
        "Покинуть: посидеть",
    ] {
        assert!(found(t).is_empty(), "{t:?}: {:?}", found(t));
    }
    has("Okafor: see you at the station.", "Okafor", PiiType::Person);
}

/// Names that are not people: towns named after one (`San Lucas`, `St. Kristina`, `Robert Ouest`), countries
/// in other languages, months beside a day, companies by their legal form, greetings and products. Beside
/// each, a person the same words would name.
#[test]
fn places_dates_firms_and_products_are_not_people() {
    for t in [
        "Trains to San Lucas de la Montaña and back.",
        "Our vendor is Buck LLC in St. Kristina.",
        "Hiring: Comptroller — Robert Ouest, Sri Lanka",
        "Flights from Αργοστόλι or Ηνωμένο Βασίλειο?",
        "Job offer in Mirandela, Nova Zelândia",
        "Best museums in Кочани or Нов Зеланд?",
        "06 Jun 2005: FIXME later",
        "We use Kozmonová Pavelová s.r.o. for that.",
        "Shipped by Петровска Ѓорѓиевски ДОО in Пробиштип.",
        "Olá! Looking for a new job.",
        "Is Amazon S3 slow on a Galaxy S24?",
        "We use TR Century Bank Inc., Joshua Ville.",
        "Invoice from Pettersson HB in Ängelholm.",
        "Xin chào! Looking for a new job.",
    ] {
        lacks(t, PiiType::Person);
    }
    has(
        "Ask Jan Kowalski about the invoice.",
        "Jan Kowalski",
        PiiType::Person,
    );
    has("Hi, my name is Jordan.", "Jordan", PiiType::Person);
    has(
        "My colleague Laura Newman called.",
        "Laura Newman",
        PiiType::Person,
    );
    has(
        "Email Sandra Svätá tomorrow.",
        "Sandra Svätá",
        PiiType::Person,
    );
}

/// An address after its cue inside a sentence (`— address 12 Oak Road`), after a key and a dash
/// (`Address - …`) or under a delivery key; other addresses and prose about addresses are left alone.
#[test]
fn addresses_after_inline_cues_dash_keys_and_delivery_keys() {
    has(
        "this is Anne Beaudoin — address 904 montée Lamontagne Apt. 151, PE G6E9B2",
        "904 montée Lamontagne Apt. 151, PE G6E9B2",
        PiiType::Address,
    );
    has(
        "это Л. Константинова — адрес пр. Крылова, д. 1/7 396857 Астрахань",
        "пр. Крылова, д. 1/7 396857 Астрахань",
        PiiType::Address,
    );
    has(
        "Name - Wesley Smith\nAddress - 32 Gary Ridgeway, North Michael, NSW, 0252",
        "32 Gary Ridgeway, North Michael, NSW, 0252",
        PiiType::Address,
    );
    has(
        "{\"customer\": \"K. Fedor\", \"deliver\": \"Tománkova 865, 953 51 Hencovce\"}",
        "Tománkova 865, 953 51 Hencovce",
        PiiType::Address,
    );
    for t in [
        "The server's IP address 10.0.0.1 is down since 3 am",
        "What is the address for the 3 o'clock meeting?",
        "Change the return address 0x7ffe in frame 2",
        "Step 3 - Read the manual, chapter 2",
    ] {
        lacks(t, PiiType::Address);
    }
}

/// Names in scripts without capitals after a self-introduction (Georgian, Thai, Korean and Japanese written
/// with a space), Georgian values under name keys, and initials before a family name; prose after the cue is
/// left alone.
#[test]
fn introduced_names_in_uncased_scripts_and_initials() {
    for (t, name) in [
        (
            "this is გურამ სიმონ ხარაიშვილი — address 1",
            "გურამ სიმონ ხარაიშვილი",
        ),
        ("สวัสดีครับ, ผมชื่อ สีหราช ถนอมมนุษย์\nขอบคุณ", "สีหราช ถนอมมนุษย์"),
        ("안녕하세요, 제 이름은 강 현준", "강 현준"),
        ("こんにちは, 私の名前は 里佳", "里佳"),
        ("Hi, my name is ჯ. სამუშია.", "ჯ. სამუშია"),
        ("recipient:\n  name: ჟენია\n  street: 5", "ჟენია"),
        ("Здравствуйте, это Н. Кабанов.", "Н. Кабанов"),
        ("Bonjour, je m'appelle G. Gagnon", "G. Gagnon"),
    ] {
        has(t, name, PiiType::Person);
    }
    for t in [
        "this is ไม่ใช่ปัญหาใหญ่ อะไร มาก นัก",
        "I. Introduction",
        "Q. What is the deadline?",
    ] {
        lacks(t, PiiType::Person);
    }
}

/// A phone key written without a colon (`Тел. 8 (808) …`, `Phone 6465.1803`, `هاتف 8001788911`); other
/// words before a number are left alone.
#[test]
fn phone_keys_without_a_colon() {
    for (t, v) in [
        ("Тел. 8 (808) 142-37-12", "8 (808) 142-37-12"),
        ("Phone 6465.1803", "6465.1803"),
        ("هاتف 8001788911", "8001788911"),
        ("Τηλ. 2040 326 654", "2040 326 654"),
    ] {
        has(t, v, PiiType::Phone);
    }
    let t = "Order 4155550134 shipped";
    lacks(t, PiiType::Phone);
}

/// Placeholder Latin signing a mock-up, a note over a form (no transcript), a quoted firm after its legal
/// form, a country of several words around a given name, and a town `-sur-Mer` are no people; a real name
/// that is also a lorem word (Dolores) still is.
#[test]
fn placeholders_notes_quoted_firms_and_towns_are_not_people() {
    for t in [
        "Kind regards,\nVoluptatum Occaecati",
        "Note: the flag is deprecated.\n\nNemo: 2007-06-01\nVero: 2323",
        "Our vendor is ИП «Давыдова Сидорова».",
        "Shipped by Müllner Oberndorfer KG since 2019.",
        "Surveyor, quantity — Bélisle, Trinidad and Tobago",
        "Trains to L' Nathalie -sur-Mer, Central African Republic",
    ] {
        lacks(t, PiiType::Person);
    }
    has(
        "Kind regards,\nDolores Haze",
        "Dolores Haze",
        PiiType::Person,
    );
}

/// Records as programs write them: a vCard property with parameters, an SQL insert's values under its named
/// columns, a recipient key alone on its line with the name and address below, and an address after a
/// phrase (`I live at`, `shipped to Name (…)`); prose after the same phrases is left alone.
#[test]
fn vcards_sql_rows_recipient_heads_and_address_phrases() {
    has(
        "BEGIN:VCARD\nFN:Lois Guit\nADR;TYPE=home:Timpad 61 8233FD Warmenhuizen\nEND:VCARD",
        "Timpad 61 8233FD Warmenhuizen",
        PiiType::Address,
    );
    let t =
        "INSERT INTO customers (id, name, street) VALUES (7, 'Ann O''Neil', '12 Oak Road, Leeds');";
    has(t, "Ann O''Neil", PiiType::Person);
    has(t, "12 Oak Road, Leeds", PiiType::Address);
    let t = "SHIP TO:\nAmahle Phetha\n7398 Commissioner Street, Kathu, 2397";
    has(t, "Amahle Phetha", PiiType::Person);
    has(t, "7398 Commissioner Street, Kathu, 2397", PiiType::Address);
    has(
        "I live at 5410 Queen Street, Paarl",
        "5410 Queen Street, Paarl",
        PiiType::Address,
    );
    has(
        "INFO order 39756 shipped to Brigita Turk (Ocvirkova ulica 64, 6139 Ljubljana)",
        "Ocvirkova ulica 64, 6139 Ljubljana",
        PiiType::Address,
    );
    for t in [
        "Let's meet me at the station at 5 then",
        "It was shipped to the warehouse on 3 May",
        "INSERT INTO stats (day, hits) VALUES ('2024-01-02', 5)",
    ] {
        lacks(t, PiiType::Address);
    }
}

/// Dashes of one and three bytes at every offset around the end of the stretch a dash key is looked for in:
/// no offset panics.
#[test]
fn dashes_at_every_offset_of_a_line_head() {
    for n in 0..64 {
        for dash in ["-", "–", "—"] {
            for t in [
                format!("{}{dash}", "a".repeat(n)),
                format!("{} {dash}", "a".repeat(n)),
                format!("{} {dash} 12 Oak Road", "Address".repeat(n / 7 + 1)),
                format!("x: 1\n{}{dash}{dash}", "é".repeat(n)),
            ] {
                found(&t);
            }
        }
    }
}

/// The number each state gives a person, in its own format: after a cue that names it in any of several
/// languages, or bare where its check digit or birth date holds. Look-alikes with a wrong check, postcodes and
/// dates are left alone.
#[test]
fn national_person_numbers_by_cue_and_by_check() {
    for (text, value) in [
        ("SSN: 982-59-7919, please keep it safe", "982-59-7919"),
        ("Mein PESEL ist 95100487787.", "95100487787"),
        ("personnummer: 870807-6065", "870807-6065"),
        (
            "Numéro de sécurité sociale : 1 75 09 17 300 379 64",
            "1 75 09 17 300 379 64",
        ),
        ("\"ssn\": \"V-9752525\"", "V-9752525"),
        ("ЕГН: 7523169263", "7523169263"),
        ("BSN 789345109 staat op mijn paspoort", "789345109"),
        ("my AHV number: 756.7893.4510.65", "756.7893.4510.65"),
        ("CPF 459.455.156-47 no cadastro", "459.455.156-47"),
        ("Codice fiscale ZCCRSR57P68G294X", "ZCCRSR57P68G294X"),
        ("id 450100196805127786 on the form", "450100196805127786"),
        ("the clerk typed 12345678Z twice", "12345678Z"),
        ("HETU 210543-464M", "210543-464M"),
        ("NI number ZZ 87 92 17 T", "ZZ 87 92 17 T"),
        ("registered as O278932873 in Taipei", "O278932873"),
    ] {
        has(text, value, PiiType::Ssn);
    }
    for text in [
        // a check digit off by one
        "ticket 450100196805127787 is closed",
        "the clerk typed 12345678A twice",
        "order 756.7893.4510.66 shipped",
        // Sinaloa and its postcode, in a Mexican address
        "Privada Zambia 927, Vieja Bahamas, SIN 05932-1482",
        "What is a SIN number? It has 9 digits.",
        "national id issued 2019-04-12, expires 2029-04-11",
    ] {
        lacks(text, PiiType::Ssn);
    }
}

/// Home directories whose names hold spaces, WSL's network paths, and the older Unix homes.
#[test]
fn home_paths_with_spaces_and_other_roots() {
    for (text, value) in [
        (
            r"open C:\Users\John Smith\Documents\report final.docx please",
            r"C:\Users\John Smith\Documents\report final.docx",
        ),
        (
            "saved to /Users/anna/Library/Mobile Documents/notes.txt yesterday",
            "/Users/anna/Library/Mobile Documents/notes.txt",
        ),
        (
            r"cd \\wsl$\Ubuntu\home\jsmith\project && make",
            r"\\wsl$\Ubuntu\home\jsmith\project",
        ),
        (
            r"\\wsl.localhost\Ubuntu-22.04\home\ann\x.py not found",
            r"\\wsl.localhost\Ubuntu-22.04\home\ann\x.py",
        ),
        (
            "source /export/home/jsmith/.profile",
            "/export/home/jsmith/.profile",
        ),
    ] {
        has(text, value, PiiType::FilePath);
    }
    // a space ends the path when no folder or file name follows it
    for (text, value) in [
        (
            r"copy C:\Users\bob\Desktop to D:\backup",
            r"C:\Users\bob\Desktop",
        ),
        (
            r"see C:\Users\bob\notes.txt for details",
            r"C:\Users\bob\notes.txt",
        ),
        ("move /home/bob/x and /home/ann/y", "/home/bob/x"),
        // another drive or home starts another path
        (r"copy C:\Users\bob\x D:\data\y", r"C:\Users\bob\x"),
        (r"C:\Users\bob\a C:\Users\ann\b", r"C:\Users\ann\b"),
    ] {
        has(text, value, PiiType::FilePath);
    }
}

/// With `file_path_mode: UserNameOnly`, a user name with a space is the whole name.
#[test]
fn a_user_name_with_a_space_is_whole() {
    let r = Redactor::new(RedactConfig {
        file_path_mode: hearth::curate::redact::FilePathMode::UserNameOnly,
        ..RedactConfig::default()
    });
    let text = r"C:\Users\John Smith\Documents\a.txt";
    let names: Vec<String> = r
        .find(text)
        .into_iter()
        .filter(|s| s.pii_type == PiiType::UserName)
        .map(|s| text.chars().skip(s.start).take(s.end - s.start).collect())
        .collect();
    assert_eq!(names, ["John Smith"]);
}

/// A country code in brackets keeps its plus (`(+358) 091390996`, as Finnish numbers are often written).
#[test]
fn a_country_code_in_brackets_with_its_plus() {
    has(
        "my number is (+358) 091390996",
        "(+358) 091390996",
        PiiType::Phone,
    );
    has(
        "Tel. (+44) 20 7946 0958",
        "(+44) 20 7946 0958",
        PiiType::Phone,
    );
}

/// Three family names after a business's cue are a firm, not three people; the same list after other words still
/// names people.
#[test]
fn firm_lists_after_a_business_cue() {
    for text in [
        "We use Lewis, Alexander and Wilson.",
        "Shipped by Davis, Rowland and Berry since 2019.",
        "Invoice from Harrell, Kim and Suarez",
        "Our vendor is Martinez, Wells and Wallace.",
        // given names and everyday words too, once the cue says it is a business
        "We use Dean, Jones and Green since 2019.",
    ] {
        lacks(text, PiiType::Person);
    }
    has(
        "Dinner with Lewis, Alexander and Wilson tonight?",
        "Wilson",
        PiiType::Person,
    );
    has(
        "We hired Dean, Jones and Green last week.",
        "Jones",
        PiiType::Person,
    );
}

/// Everyday words after a closing sign for no one (`Wakker Begin`); a name with a family name still does.
#[test]
fn everyday_words_after_a_closing_are_no_signature() {
    for text in [
        "Met vriendelijke groet,\nWakker Begin",
        "Bien cordialement,\nJusque Carte",
        "Cordiali saluti,\nStorico Articolo",
    ] {
        lacks(text, PiiType::Person);
    }
    has(
        "С уважением,\nБогдан Шарапов",
        "Богдан Шарапов",
        PiiType::Person,
    );
    has(
        "Met vriendelijke groet,\nJan de Vries",
        "Jan de Vries",
        PiiType::Person,
    );
}
