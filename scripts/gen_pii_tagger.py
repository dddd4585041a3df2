#!/usr/bin/env python3
"""Third PII generator: training data for the redactor's learned name/address tagger.

Written independently of ../shared/tools/gen_pii.py and scripts/gen_pii_heldout.py (neither is
read or imported): a record is a random chain of 1-4 *segments* (chat lines, form fields, letter
blocks, table rows, vCards, SQL rows, XML, log lines, shipping labels ...) with cue words in the
record's language, so layouts combine in ways no fixed template list has. About a quarter of the
records hold no PII but look like they might: companies, cities and countries alone, product
names, capitalised headings, code.

Two splits, each from its own seed and segment list:
  --split train   what the tagger is trained on
  --split test    never trained or tuned on; reported beside dev and held-out. Four segment kinds of
                  its own (invoice, JSON, sentence, YAML) beside three shared ones; twelve of its sixteen
                  locales (Georgian, Armenian, Estonian, Slovak, Macedonian, Greek, ...) are never in training

Output: the JSONL schema score_pii.py reads ({"id","kind","template","locale","text","spans"},
code-point offsets, end exclusive). PERSON and ADDRESS are the tagger's types; EMAIL, PHONE and
a few others are filled in so that the tagger learns to leave them to the rules.

usage: gen_pii_tagger.py --split train|test --n N --seed S --out FILE   (needs `pip install faker`)
"""
import argparse
import datetime
import json
import os
import random
import sys

# Faker's set-based providers follow the string hash: pin it so that one seed gives one file.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

from faker import Faker  # noqa: E402

TRAIN_LOCALES = [
    "en_US", "en_GB", "en_IN", "en_NZ", "en_PH", "en_NG", "de_DE", "de_LU", "fr_FR", "fr_BE", "fr_CH",
    "it_IT", "it_CH", "es_ES", "es_AR", "es_CL", "pt_BR", "nl_NL", "nl_BE", "da_DK", "pl_PL", "lt_LT",
    "lv_LV", "sl_SI", "bg_BG", "ru_RU", "uk_UA", "az_AZ", "tr_TR", "el_CY", "he_IL", "ar_EG", "ar_SA",
    "fa_IR", "hi_IN", "bn_BD", "ne_NP", "ta_IN", "th_TH", "vi_VN", "id_ID", "fil_PH", "ja_JP", "zh_CN",
    "zh_TW", "ko_KR", "hu_HU", "cs_CZ", "ro_RO", "sv_SE", "fi_FI", "no_NO", "is_IS", "hr_HR", "sq_AL",
    "ga_IE", "sw", "zu_ZA",
]
# The own test split: twelve locales the tagger never sees in training (two of them scripts it
# never sees: Georgian, Armenian), and four it does (ko_KR, ru_RU, ja_JP, th_TH).
TEST_LOCALES = ["ka_GE", "hy_AM", "et_EE", "sk_SK", "mk_MK", "en_AU", "de_AT", "es_MX", "pt_PT",
                "el_GR", "ko_KR", "ru_RU", "ja_JP", "ar_AE", "fr_CA", "th_TH"]

NOSPACE = {"zh_CN", "zh_TW", "ja_JP"}
FAMILY_FIRST = {"zh_CN", "zh_TW", "ja_JP", "ko_KR", "hu_HU", "vi_VN"}

# Cue words per language (first two letters of the locale); "en" is the fallback.
CUES = {
    "en": dict(name="Name", addr="Address", hello="Hi", me="my name is", live="I live at", to="Ship to",
               contact="Contact", regards="Kind regards", from_="From", tel="Phone", city="City",
               meet="meet me at", ask="please send the parcel to", who="this is"),
    "de": dict(name="Name", addr="Anschrift", hello="Hallo", me="ich heiße", live="ich wohne in der",
               to="Lieferadresse", contact="Ansprechpartner", regards="Viele Grüße", from_="Von", tel="Telefon",
               city="Ort", meet="Treffpunkt", ask="bitte an folgende Adresse schicken:", who="hier ist"),
    "fr": dict(name="Nom", addr="Adresse", hello="Bonjour", me="je m'appelle", live="j'habite au",
               to="Livrer à", contact="Contact", regards="Cordialement", from_="De", tel="Tél.", city="Ville",
               meet="rendez-vous au", ask="merci d'envoyer le colis au", who="c'est"),
    "es": dict(name="Nombre", addr="Dirección", hello="Hola", me="me llamo", live="vivo en", to="Enviar a",
               contact="Contacto", regards="Saludos", from_="De", tel="Tel.", city="Ciudad", meet="nos vemos en",
               ask="envíen el paquete a", who="soy"),
    "it": dict(name="Nome", addr="Indirizzo", hello="Ciao", me="mi chiamo", live="abito in", to="Spedire a",
               contact="Referente", regards="Cordiali saluti", from_="Da", tel="Tel.", city="Città",
               meet="ci vediamo in", ask="spedite il pacco a", who="sono"),
    "pt": dict(name="Nome", addr="Endereço", hello="Olá", me="meu nome é", live="moro na", to="Entregar em",
               contact="Contato", regards="Atenciosamente", from_="De", tel="Tel.", city="Cidade",
               meet="me encontre na", ask="mandem a encomenda para", who="aqui é"),
    "nl": dict(name="Naam", addr="Adres", hello="Hoi", me="ik heet", live="ik woon op", to="Bezorgen op",
               contact="Contactpersoon", regards="Met vriendelijke groet", from_="Van", tel="Tel.", city="Plaats",
               meet="zie je bij", ask="stuur het pakket naar", who="met"),
    "ru": dict(name="ФИО", addr="Адрес", hello="Здравствуйте", me="меня зовут", live="я живу по адресу",
               to="Адрес доставки", contact="Контактное лицо", regards="С уважением", from_="От", tel="Тел.",
               city="Город", meet="встречаемся у", ask="пришлите посылку на", who="это"),
    "uk": dict(name="ПІБ", addr="Адреса", hello="Добрий день", me="мене звати", live="я живу за адресою",
               to="Доставка", contact="Контакт", regards="З повагою", from_="Від", tel="Тел.", city="Місто",
               meet="зустрічаємось біля", ask="надішліть посилку на", who="це"),
    "bg": dict(name="Име", addr="Адрес", hello="Здравейте", me="казвам се", live="живея на", to="Доставка до",
               contact="Лице за контакт", regards="Поздрави", from_="От", tel="Тел.", city="Град", meet="среща на",
               ask="изпратете пратката на", who="това е"),
    "pl": dict(name="Imię i nazwisko", addr="Adres", hello="Cześć", me="nazywam się", live="mieszkam przy",
               to="Adres dostawy", contact="Osoba kontaktowa", regards="Pozdrawiam", from_="Od", tel="Tel.",
               city="Miasto", meet="spotkajmy się przy", ask="proszę wysłać paczkę na", who="tu"),
    "tr": dict(name="Ad Soyad", addr="Adres", hello="Merhaba", me="benim adım", live="adresim", to="Teslimat",
               contact="İlgili kişi", regards="Saygılarımla", from_="Kimden", tel="Tel", city="Şehir",
               meet="buluşma yeri", ask="kargoyu şu adrese gönderin:", who="ben"),
    "he": dict(name="שם", addr="כתובת", hello="שלום", me="קוראים לי", live="אני גר ב", to="משלוח אל",
               contact="איש קשר", regards="בברכה", from_="מאת", tel="טלפון", city="עיר", meet="נפגש ב",
               ask="נא לשלוח את החבילה ל", who="מדבר"),
    "ar": dict(name="الاسم", addr="العنوان", hello="مرحبا", me="اسمي", live="أسكن في", to="الشحن إلى",
               contact="جهة الاتصال", regards="مع التحية", from_="من", tel="هاتف", city="المدينة",
               meet="نلتقي عند", ask="أرسلوا الطرد إلى", who="معك"),
    "fa": dict(name="نام", addr="نشانی", hello="سلام", me="اسم من", live="من در", to="ارسال به",
               contact="رابط", regards="با احترام", from_="از", tel="تلفن", city="شهر", meet="قرار در",
               ask="لطفاً بسته را به این نشانی بفرستید:", who="من"),
    "hi": dict(name="नाम", addr="पता", hello="नमस्ते", me="मेरा नाम", live="मैं यहाँ रहता हूँ:", to="भेजें",
               contact="संपर्क", regards="धन्यवाद", from_="प्रेषक", tel="फ़ोन", city="शहर", meet="मिलते हैं",
               ask="कृपया पार्सल यहाँ भेजें:", who="मैं"),
    "bn": dict(name="নাম", addr="ঠিকানা", hello="নমস্কার", me="আমার নাম", live="আমি থাকি", to="পাঠান",
               contact="যোগাযোগ", regards="ধন্যবাদ", from_="প্রেরক", tel="ফোন", city="শহর", meet="দেখা হবে",
               ask="দয়া করে পার্সেলটি পাঠান:", who="আমি"),
    "th": dict(name="ชื่อ", addr="ที่อยู่", hello="สวัสดีครับ", me="ผมชื่อ", live="บ้านอยู่ที่", to="ส่งถึง",
               contact="ผู้ติดต่อ", regards="ขอบคุณครับ", from_="จาก", tel="โทร", city="จังหวัด", meet="เจอกันที่",
               ask="ช่วยส่งของไปที่", who="นี่คือ"),
    "vi": dict(name="Họ tên", addr="Địa chỉ", hello="Xin chào", me="tôi tên là", live="tôi sống ở", to="Giao đến",
               contact="Liên hệ", regards="Trân trọng", from_="Từ", tel="ĐT", city="Thành phố", meet="gặp tại",
               ask="gửi hàng đến", who="tôi là"),
    "id": dict(name="Nama", addr="Alamat", hello="Halo", me="nama saya", live="saya tinggal di", to="Kirim ke",
               contact="Kontak", regards="Salam", from_="Dari", tel="Telp", city="Kota", meet="ketemu di",
               ask="tolong kirim paket ke", who="ini"),
    "ja": dict(name="氏名", addr="住所", hello="こんにちは", me="私の名前は", live="住所は", to="お届け先",
               contact="担当者", regards="よろしくお願いします", from_="差出人", tel="電話", city="市区町村",
               meet="待ち合わせは", ask="荷物の送り先は", who="こちらは"),
    "zh": dict(name="姓名", addr="地址", hello="你好", me="我叫", live="我住在", to="收货地址", contact="联系人",
               regards="此致敬礼", from_="发件人", tel="电话", city="城市", meet="在这里见", ask="请把包裹寄到",
               who="我是"),
    "ko": dict(name="이름", addr="주소", hello="안녕하세요", me="제 이름은", live="저는 여기 삽니다:", to="배송지",
               contact="담당자", regards="감사합니다", from_="보낸 사람", tel="전화", city="도시", meet="만나는 곳",
               ask="택배는 여기로 보내주세요:", who="저는"),
    "el": dict(name="Όνομα", addr="Διεύθυνση", hello="Γεια σας", me="με λένε", live="μένω στην", to="Αποστολή σε",
               contact="Επαφή", regards="Με εκτίμηση", from_="Από", tel="Τηλ.", city="Πόλη", meet="συναντιόμαστε στην",
               ask="στείλτε το δέμα στη", who="είμαι"),
    "hu": dict(name="Név", addr="Cím", hello="Szia", me="a nevem", live="lakcímem", to="Szállítási cím",
               contact="Kapcsolattartó", regards="Üdvözlettel", from_="Feladó", tel="Tel.", city="Város",
               meet="találkozó", ask="kérem a csomagot ide küldeni:", who="itt"),
    "cs": dict(name="Jméno", addr="Adresa", hello="Dobrý den", me="jmenuji se", live="bydlím na adrese",
               to="Doručit na", contact="Kontaktní osoba", regards="S pozdravem", from_="Od", tel="Tel.",
               city="Město", meet="sejdeme se na", ask="pošlete balík na", who="tady"),
    "fi": dict(name="Nimi", addr="Osoite", hello="Hei", me="nimeni on", live="asun osoitteessa", to="Toimitus",
               contact="Yhteyshenkilö", regards="Ystävällisin terveisin", from_="Lähettäjä", tel="Puh.",
               city="Kaupunki", meet="tavataan", ask="lähettäkää paketti osoitteeseen", who="täällä"),
    "sv": dict(name="Namn", addr="Adress", hello="Hej", me="jag heter", live="jag bor på", to="Leverans till",
               contact="Kontaktperson", regards="Med vänliga hälsningar", from_="Från", tel="Tel.", city="Ort",
               meet="vi ses vid", ask="skicka paketet till", who="det är"),
    "da": dict(name="Navn", addr="Adresse", hello="Hej", me="jeg hedder", live="jeg bor på", to="Levering til",
               contact="Kontaktperson", regards="Venlig hilsen", from_="Fra", tel="Tlf.", city="By",
               meet="vi ses på", ask="send pakken til", who="det er"),
}
# Languages without their own cues borrow English ones (code-mixed text is common in chat).

DOMAINS = ["example.com", "mail.test", "post.example", "inbox.invalid"]
PRODUCTS = ["ThinkPad X1", "Galaxy S24", "Kindle Paperwhite", "PlayStation 5", "Model Y", "AirPods Pro",
            "Surface Laptop", "Pixel 9", "Raspberry Pi 5", "Steam Deck", "Nintendo Switch", "iPhone 15"]
TECH = ["PostgreSQL", "Kubernetes", "Docker Compose", "GitHub Actions", "Visual Studio Code", "React Native",
        "Apache Kafka", "Amazon S3", "Google Cloud Run", "Microsoft Teams", "Jupyter Notebook", "Rust Analyzer"]
# Chat and tool phrases with capitalised words that name no one (sentence starts, weekdays, HTTP
# verbs, log words, acronyms), written for this generator.
FILLERS = [
    "Should I restart the service first?", "Okay, that fixed it.", "Call the endpoint twice and it fails.",
    "Thanks a lot!", "File an issue if it happens again.", "I think the cache is stale.", "Could you explain why?",
    "Please review the patch.", "Any idea what causes this?", "Note: the flag is deprecated.", "Update: works now.",
    "GET /api/v2/items HTTP/1.1", "PUT /orders/17 returned 409", "DELETE requests are blocked by the proxy.",
    "Mon Jan 12 08:15:02 UTC 2026", "Fri, 03 Apr 2026 17:40:11 +0200", "Sat Aug 9 2025", "Wed 14:30",
    "ERROR Connection refused", "WARN Retrying in 5s", "INFO Server started on port 8080", "DEBUG Cache miss",
    "Traceback (most recent call last):", "Caused by: java.lang.NullPointerException", "Done.", "Yes, exactly.",
    "What is the difference between an IBAN and a BIC?", "Do I need my SSN for this form?", "See the README.",
    "Happy New Year!", "Good Morning everyone", "Dear Team,", "Hello World", "Best Practices for Docker",
    "TODO: remove this hack", "FIXME later", "PS: the build is green again.", "My Slack is down today.",
    "Click Save, then Export as PDF.", "Open Settings > Privacy > Location.", "Step 3: Run the Installer",
    "Monday works for me.", "See you on Thursday!", "In March we ship version 2.", "Sunday Brunch Menu",
    "The New York Times", "Black Friday Deals", "Chapter 4: Results", "Section 2.1 Methods", "Appendix B",
    "CEO", "CTO", "HR", "IT Support", "QA", "USB-C", "Wi-Fi", "NASA", "EU GDPR", "VAT", "PDF", "JSON", "API",
]
HEADINGS = ["Release Notes", "Getting Started", "Known Issues", "Table of Contents", "Quarterly Report",
            "Action Items", "Meeting Minutes", "Project Overview", "Privacy Policy", "Terms of Service"]


# Faker draws dates up to "now": pinned (in our calls, and in the providers' own calls for
# weekday and month names), so that one seed gives one file on any day.
DATES_END = datetime.datetime(2026, 1, 1)


def pin_dates(f):
    for p in f.providers:
        if hasattr(p, "date_time") and hasattr(p, "day_of_week"):
            orig = p.date_time
            p.date_time = lambda tzinfo=None, end_datetime=None, _o=orig: _o(tzinfo, end_datetime or DATES_END)


class Gen:
    def __init__(self, seed, locales):
        self.r = random.Random(seed)
        self.fakers = {}
        for loc in sorted(set(locales) | {"en_US"}):
            f = Faker(loc)
            f.seed_instance(self.r.randrange(1 << 30))
            pin_dates(f)
            self.fakers[loc] = f
        self.loc = "en_US"

    @property
    def f(self):
        return self.fakers[self.loc]

    @property
    def cue(self):
        lang = self.loc.split("_")[0]
        if lang in CUES and self.r.random() < 0.8:
            return CUES[lang]
        return CUES["en"]

    def _try(self, *names):
        for n in names:
            try:
                v = getattr(self.f, n)()
                if v:
                    return " ".join(str(v).split())
            except (AttributeError, TypeError, ValueError, KeyError, IndexError):
                continue
        return " ".join(getattr(self.fakers["en_US"], names[0])().split())

    # ---- PII values ------------------------------------------------------------------
    def first(self):
        return self._try("first_name")

    def last(self):
        return self._try("last_name")

    def person(self):
        r = self.r.random()
        if r < 0.12:
            return self.first()
        first, last = self.first(), self.last()
        if self.loc in NOSPACE:
            return last + ("" if self.r.random() < 0.8 else " ") + first
        if self.loc in FAMILY_FIRST:
            return f"{last} {first}"
        if r < 0.22:
            return f"{first} {self.first()} {last}"
        if r < 0.28:
            return f"{first[0]}. {last}"
        if r < 0.33:
            return f"{last}, {first}"
        return f"{first} {last}"

    def addr_lines(self):
        r = self.r.random()
        if r < 0.2:
            return [self._try("street_address")]
        if r < 0.35:
            return [self._try("street_address"), self._try("city")]
        if r < 0.45:
            return [self._try("street_address"), f"{self._try('postcode')} {self._try('city')}"]
        raw = self._try_raw_address()
        return raw

    def _try_raw_address(self):
        try:
            raw = self.f.address()
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            raw = self.fakers["en_US"].address()
        lines = [" ".join(ln.split()).strip(" ,") for ln in raw.split("\n")]
        return [ln for ln in lines if ln]

    def address(self, multiline=False):
        lines = self.addr_lines()
        return ("\n" if multiline else self.r.choice([", ", ", ", " "])).join(lines)

    def email(self):
        return f"{self.r.choice(['j', 'info', 'k.m', 'mail', 'contact'])}{self.r.randint(1, 999)}@{self.r.choice(DOMAINS)}"

    def phone(self):
        try:
            return self.f.phone_number()
        except (AttributeError, TypeError):
            return self.fakers["en_US"].phone_number()

    # ---- non-PII look-alikes ----------------------------------------------------------
    def company(self):
        return self._try("company")

    def city(self):
        return self._try("city")

    def country(self):
        return self._try("country")

    def job(self):
        return self._try("job")


# A segment is a list of parts: plain strings, or (TYPE, value) tuples for gold spans.
def seg_chat_intro(g):
    c = g.cue
    return [f"{c['hello']}, {c['me']} ", ("PERSON", g.person()), g.r.choice([". ", "! ", ", "])]


def seg_chat_live(g):
    c = g.cue
    return [f"{c['live']} ", ("ADDRESS", g.address()), g.r.choice([".", "", " :)", "!"])]


def seg_field_block(g):
    c = g.cue
    sep = g.r.choice([": ", ":\t", " - ", "："])
    parts = [f"{c['name']}{sep}", ("PERSON", g.person()), "\n", f"{c['addr']}{sep}", ("ADDRESS", g.address())]
    if g.r.random() < 0.5:
        parts += ["\n", f"{c['tel']}{sep}", ("PHONE", g.phone())]
    return parts


def seg_letter_sig(g):
    c = g.cue
    return [f"{c['regards']},\n", ("PERSON", g.person()), "\n", ("ADDRESS", g.address(multiline=True))]


def seg_shipping_label(g):
    c = g.cue
    return [f"{c['to'].upper() if g.r.random() < 0.3 else c['to']}:\n", ("PERSON", g.person()), "\n",
            ("ADDRESS", g.address(multiline=True)), "\n"]


def seg_csv(g):
    rows = ["id;name;city;amount"]
    parts = []
    for i in range(g.r.randint(1, 3)):
        parts += [f"\n{g.r.randint(100, 999)};", ("PERSON", g.person()), f";{g.city()};{g.r.randint(1, 500)}.00"]
    return [rows[0]] + parts


def seg_vcard(g):
    return ["BEGIN:VCARD\nFN:", ("PERSON", g.person()), "\nADR;TYPE=home:", ("ADDRESS", g.address()),
            "\nEMAIL:", ("EMAIL", g.email()), "\nEND:VCARD"]


def seg_sql(g):
    return ["INSERT INTO customers (name, street) VALUES ('", ("PERSON", g.person()), "', '",
            ("ADDRESS", g.address()), "');"]


def seg_xml(g):
    return ["<customer>\n  <fullName>", ("PERSON", g.person()), "</fullName>\n  <city>", g.city(),
            "</city>\n</customer>"]


def seg_log(g):
    return [f"2026-0{g.r.randint(1, 9)}-1{g.r.randint(0, 9)} INFO order {g.r.randint(10000, 99999)} shipped to ",
            ("PERSON", g.person()), " (", ("ADDRESS", g.address()), ")"]


def seg_meeting(g):
    c = g.cue
    return [f"{c['meet']} ", ("ADDRESS", g.address()), f", {c['contact']}: ", ("PERSON", g.person())]


def seg_mention(g):
    return [g.r.choice(["cc ", "thanks to ", "ping ", "@"]), ("PERSON", g.person()),
            g.r.choice([" for the review", ", can you check?", " — see above", ""])]


def seg_ask_parcel(g):
    c = g.cue
    return [f"{c['ask']} ", ("ADDRESS", g.address()), ", ", ("PERSON", g.person())]


def seg_md_table(g):
    parts = ["| owner | site |\n|---|---|"]
    for _ in range(g.r.randint(1, 2)):
        parts += ["\n| ", ("PERSON", g.person()), " | ", g.city(), " |"]
    return parts


def seg_from_header(g):
    c = g.cue
    return [f"{c['from_']}: ", ("PERSON", g.person()), " <", ("EMAIL", g.email()), ">\n"]


# ---- test-only segments (never in training) --------------------------------------------
def seg_t_invoice(g):
    c = g.cue
    return [f"INVOICE #{g.r.randint(1000, 9999)}\nBill to: ", ("PERSON", g.person()), "\n",
            ("ADDRESS", g.address(multiline=True)), f"\n{c['tel']} ", ("PHONE", g.phone())]


def seg_t_json(g):
    return ['{"customer": "', ("PERSON", g.person()), '", "deliver": "', ("ADDRESS", g.address()), '"}']


def seg_t_sentence(g):
    c = g.cue
    return [f"{c['who']} ", ("PERSON", g.person()), f" — {c['addr'].lower()} ", ("ADDRESS", g.address())]


def seg_t_yaml(g):
    return ["recipient:\n  name: ", ("PERSON", g.person()), "\n  street: ", ("ADDRESS", g.address())]


# ---- PII-free segments ---------------------------------------------------------------
def neg_company(g):
    return [g.r.choice(["We use ", "Our vendor is ", "Shipped by ", "Invoice from "]), g.company(),
            g.r.choice([" since 2019.", ".", " in ", ", "]), g.city(), "."]


def neg_travel(g):
    return [g.r.choice(["Flights from ", "Trains to ", "Weather in ", "Best museums in "]), g.city(),
            g.r.choice([" and ", " or ", ", "]), g.country(), "?"]


def neg_tech(g):
    return [g.r.choice(["Why does ", "How do I configure ", "Upgrading ", "Is "]), g.r.choice(TECH),
            g.r.choice([" fail on startup?", " slow on a ", " compatible with "]), g.r.choice(PRODUCTS), "?"]


def neg_heading(g):
    return ["## ", g.r.choice(HEADINGS), "\n- ", g.r.choice(HEADINGS), "\n- ", g.job()]


def neg_job(g):
    c = g.cue
    return [f"{c['hello']}! ", g.r.choice(["Looking for a ", "Hiring: ", "Position open: "]), g.job(), " — ",
            g.city(), ", ", g.country()]


def neg_lorem(g):
    try:
        return [g.f.sentence(nb_words=g.r.randint(4, 12))]
    except (AttributeError, TypeError, ValueError):
        return [g.fakers["en_US"].sentence()]


def neg_filler(g):
    return [g.r.choice(FILLERS)]


def neg_date(g):
    f = g.f
    return [g.r.choice([f.date(end_datetime=DATES_END), f.date_time(end_datetime=DATES_END).strftime("%a %b %d %H:%M:%S %Y"), f.day_of_week(), f.month_name(),
                        f.date_time(end_datetime=DATES_END).strftime("%d %b %Y"), f.time(end_datetime=DATES_END)]), g.r.choice([" ", ": ", " - "]), g.r.choice(FILLERS)]


def _word(g):
    try:
        return g.f.word()
    except (AttributeError, TypeError, ValueError):
        return g.fakers["en_US"].word()


def neg_fields(g):
    """Form fields whose labels and values name no one: a capitalised word at a line start,
    before a colon, is a label far more often than a name."""
    parts = []
    for _ in range(g.r.randint(1, 4)):
        label = _word(g).capitalize() if g.r.random() < 0.7 else g.r.choice(["Status", "Created", "Filed", "Due"])
        value = g.r.choice([g.f.date(end_datetime=DATES_END), str(g.r.randint(1, 9999)), _word(g), g.r.choice(PRODUCTS), "n/a", "—"])
        parts.append(f"{label}: {value}\n")
    return parts


def neg_closing(g):
    """Sign-offs from a team, not a person, in the record's language."""
    c = g.cue
    return [f"{c['regards']},\n{_word(g).capitalize()} {_word(g).capitalize()}"
            if g.r.random() < 0.3 else f"{c['regards']},\n{g.r.choice(['Support', 'Team', 'Service', 'Kundenservice', 'Equipo', 'Équipe'])}"]


def neg_code(g):
    return [f"fn {g.r.choice(['parse', 'load', 'Main', 'Render'])}() {{ let Config = Settings::new(); }}"]


TRAIN_SEGS = [seg_chat_intro, seg_chat_live, seg_field_block, seg_letter_sig, seg_shipping_label, seg_csv,
              seg_vcard, seg_sql, seg_xml, seg_log, seg_meeting, seg_mention, seg_ask_parcel, seg_md_table,
              seg_from_header]
TEST_SEGS = [seg_t_invoice, seg_t_json, seg_t_sentence, seg_t_yaml, seg_chat_intro, seg_field_block,
             seg_letter_sig]
NEG_SEGS = [neg_company, neg_travel, neg_tech, neg_heading, neg_job, neg_code, neg_lorem, neg_lorem, neg_filler,
            neg_filler, neg_date, neg_fields, neg_closing]
SPLITS = {"train": (TRAIN_SEGS, TRAIN_LOCALES), "test": (TEST_SEGS, TEST_LOCALES)}


def record(g, segs, neg):
    n = g.r.randint(1, 3)
    pool = NEG_SEGS if neg else segs
    chosen = [g.r.choice(pool) for _ in range(n)]
    # PII-free sentences around the PII, so that capitalised words near a name are seen as words
    for _ in range(g.r.choice([0, 1, 1, 2]) if not neg else 0):
        chosen.insert(g.r.randrange(len(chosen) + 1), g.r.choice(NEG_SEGS))
    text, spans = "", []
    for i, fn in enumerate(chosen):
        if i:
            text += g.r.choice(["\n", "\n\n", " ", "\n"])
        for p in fn(g):
            if isinstance(p, tuple):
                spans.append({"start": len(text), "end": len(text) + len(p[1]), "type": p[0], "value": p[1]})
                text += p[1]
            else:
                text += p
    return text, spans


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=sorted(SPLITS), required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--neg-frac", type=float, default=0.3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    segs, locales = SPLITS[a.split]
    g = Gen(a.seed, locales)
    with open(a.out, "w", encoding="utf-8") as out:
        for i in range(a.n):
            g.loc = g.r.choice(locales)
            neg = g.r.random() < a.neg_frac
            text, spans = record(g, segs, neg)
            for s in spans:
                assert text[s["start"]:s["end"]] == s["value"]
            rec = {"id": i, "kind": "negative" if neg else "pii", "template": a.split, "locale": g.loc,
                   "text": text, "spans": spans, "decoys": []}
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
