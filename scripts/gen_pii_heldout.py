#!/usr/bin/env python3
"""Second PII generator, written independently of ../shared/tools/gen_pii.py, to measure how
the redactor holds on text it was never tuned on.

Other document kinds (CSV rows, git config, mail headers, commit trailers, stack traces, shell
commands, signatures with the address on lines of its own, chat logs, JSON, YAML, forms),
many locales and scripts, national phone formats, bare SSNs after a cue, each locale's national person number, and PII-free records
with look-alikes (header words, salutation phrases, Message-IDs, loyalty and tracking numbers).

Two splits, each from its own seed AND its own templates and locales:
  --split dev      templates and locales the redactor may be tuned on
  --split heldout  templates and locales held back; never tune on it, only report it

Output: the JSONL schema of gen_pii.py / score_pii.py:
  {"id", "kind": "pii"|"negative", "template": "<split>:<name>", "locale", "text",
   "spans": [{"start","end","type","value"}], "decoys": [{"start","end","kind","value"}]}
Offsets are code points, end exclusive.

usage: gen_pii_heldout.py --split dev|heldout --n N --seed S --out FILE   (needs `pip install faker`)
"""
import argparse
import json
import os
import random
import re
import string
import sys

# Some Faker providers draw from sets, whose order follows the per-process string hash: pin it, so that one
# seed gives one file.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

from faker import Faker  # noqa: E402

# ---- locales ---------------------------------------------------------------------------
# Scripts and languages are spread over both splits; each locale is in one split only.
DEV_LOCALES = ["en_US", "en_US", "en_GB", "de_DE", "es_ES", "fr_FR", "it_IT", "ru_RU", "ja_JP",
               "zh_CN", "tr_TR", "da_DK", "pl_PL", "nl_NL", "pt_BR", "hu_HU"]
HELD_LOCALES = ["en_CA", "en_AU", "en_IE", "de_AT", "de_CH", "es_MX", "es_CO", "fi_FI", "sv_SE",
                "no_NO", "ko_KR", "zh_TW", "uk_UA", "cs_CZ", "sk_SK", "pt_PT", "ro_RO", "hr_HR",
                "el_GR", "fr_CA"]
# Family name first, no space between parts.
CJK_NOSPACE = {"zh_CN", "zh_TW", "ko_KR"}
FAMILY_FIRST = {"ja_JP", "hu_HU"} | CJK_NOSPACE


# ---- templates ---------------------------------------------------------------------------
# {TYPE} or {TYPE:variant} = gold PII slot; {~KIND} = hard negative (decoy) slot.
# TYPE: NAME (full), FIRST (first name alone), LAST, ADDR (one line), ADDRML (lines of its
# own), PHONE, PHONEBARE, SSN, SSNBARE, NATID (the locale's national person number), EMAIL, CARD, IBAN, IP, KEY, PATH, WSLPATH.
DEV_TEMPLATES = {
    "csv_people": "id,first_name,last_name,email,phone\n{~INT},{FIRST},{LAST},{EMAIL},{PHONEBARE}\n{~INT},{FIRST},{LAST},{EMAIL},{PHONE}",
    "csv_quoted": 'name;city;tel\n"{NAME}";{~CITY};{PHONE}\n',
    "gitconfig": "my ~/.gitconfig looks like this, why are my commits unsigned?\n\n[user]\n\tname = {NAME}\n\temail = {EMAIL}\n[commit]\n\tgpgsign = true\n",
    "mail_from_quoted": 'From: "{NAME}" <{EMAIL}>\nTo: {EMAIL}\nSubject: Re: quote #{~INT}\nMessage-ID: <{~MSGID}>\n\nsee attached, call me on {PHONE}',
    "git_log": "commit {~GITSHA}\nAuthor: {NAME} <{EMAIL}>\nDate:   {~GITDATE}\n\n    fix flaky test in parser\n\nwhy does bisect point here?",
    "trailer": "Please review:\n\n    net: fix refcount leak\n\n    Signed-off-by: {NAME} <{EMAIL}>\n    Reviewed-by: {NAME} <{EMAIL}>",
    "trace_wsl_py": 'Traceback (most recent call last):\n  File "{WSLPATH}", line {~INT}, in run\n    raise ValueError(x)\nValueError: bad row',
    "shell_wsl": "$ cd {WSLPATH} && ls -la\nls: cannot open directory: Permission denied",
    "signature_ml": "Thanks for the quick fix!\n\nBest regards,\n{NAME}\n{ADDRML}\nTel. {PHONE}",
    "signature_de": "Hallo zusammen,\n\nanbei die Rechnung.\n\nMit freundlichen Grüßen\n{NAME}\n{ADDRML}",
    "chat_irc": "[{~CLOCK}] <{FIRST}> can someone ping {NAME}? his number is {PHONE}\n[{~CLOCK}] <bot> ok",
    "chat_whatsapp": "{~DMY}, {~CLOCK} - {NAME}: meet me at {ADDR}\n{~DMY}, {~CLOCK} - {NAME}: 👍",
    "json_user": '{{"user": {{"name": "{NAME}", "email": "{EMAIL}", "phone": "{PHONE}"}}, "plan": "pro", "seats": {~INT}}}',
    "json_addr": 'POST /api/orders returns 422 for\n{{"shipTo": {{"fullName": "{NAME}", "line1": "{ADDR}"}}, "qty": {~INT}}}',
    "ssn_bare": "my social is {SSNBARE}, can you check if the form accepts it without dashes?",
    "ssn_form": "Applicant: {NAME}\nSSN: {SSN}\nFiled: {~DMY}",
    "natid_form": "Applicant: {NAME}\nNational ID: {NATID}\nFiled: {~DMY}",
    "natid_chat": "my social security number is {NATID}, can you fill in the rest?",
    "phone_ext": "Reach our office at {PHONE:ext} or e-mail {EMAIL}.",
    "table_first": "| # | name | role |\n|---|------|------|\n| 1 | {FIRST} | admin |\n| 2 | {FIRST} | viewer |",
    "card_iban": "Paid with {CARD}; refund goes to IBAN {IBAN} ({NAME}).",
    "ip_key": "ssh deploy@{IP} works but the API rejects token {KEY}",
    "addr_ask": "Is {ADDR} inside the delivery zone?",
    "path_home": "pytest fails in {PATH} with ImportError",
    "yaml_contact": "contact:\n  person: {NAME}\n  phone: {PHONE}\n  address: {ADDR}\n",
}
HELD_TEMPLATES = {
    "tsv_people": "name\tphone\temail\n{NAME}\t{PHONEBARE}\t{EMAIL}\n{NAME}\t{PHONE}\t{EMAIL}",
    "csv_roster": "team,member,ext\nops,{FIRST},{~INT}\nsec,{NAME},{~INT}",
    "git_config_cmd": 'git config --global user.name "{NAME}"\ngit config --global user.email {EMAIL}\n\nstill shows the old author?',
    "mail_headers": 'Return-Path: <{EMAIL}>\nFrom: "{NAME}" <{EMAIL}>\nReply-To: {EMAIL}\nMessage-ID: <{~MSGID}>\nSubject: invoice {~INT}\n\nbody',
    "author_line": "Author: {NAME}\nLicense: MIT\nVersion: {~SEMVER}\n\nwhat does this header mean for reuse?",
    "co_author": "git commit -m 'docs: typo' -m 'Co-authored-by: {NAME} <{EMAIL}>'",
    "trace_node_wsl": "Error: ENOENT: no such file or directory\n    at Object.openSync (node:fs:{~INT}:3)\n    at load ({WSLPATH}:{~INT}:17)",
    "trace_java_win": "java.io.FileNotFoundException: {PATH} (Access is denied)\n\tat java.io.FileInputStream.open0(Native Method)",
    "shell_cp": "cp ~/build/out.zip {WSLPATH} fails with 'No such file'",
    "signature_plain": "Cheers,\n{NAME}\n{ADDRML}\n{PHONE}",
    "letter_head": "{NAME}\n{ADDRML}\n\nDear Sir or Madam,\n\nI am writing to cancel my contract.",
    "chat_slack": "{FIRST}: hey, drop the package at {ADDR}\n{FIRST}: or call {PHONE}",
    "chat_quote": '> {NAME} wrote:\n> you can reach me at {PHONE}\nthanks, noted',
    "json_list": '[{{"id": {~INT}, "name": "{NAME}", "tel": "{PHONEBARE}"}}, {{"id": {~INT}, "name": "{FIRST}"}}]',
    "json_address": '{{"customer": "{NAME}", "address": "{ADDR}", "loyalty": "{~LOYALTY}"}}',
    "ssn_cue": "Her SSN is {SSNBARE} and she was born in {~YEAR}.",
    "ssn_social": "social security number: {SSN}",
    "natid_json": '{{"name": "{NAME}", "nationalId": "{NATID}", "plan": "basic"}}',
    "natid_bare": "The form rejected my number {NATID} as invalid, but it is correct. Why?",
    "natid_letter": "Dear HR,\nplease find my tax number {NATID} for the payroll.\nRegards, {NAME}",
    "phone_national": "Meine Nummer: {PHONE:nat}, bitte nach 18 Uhr anrufen.",
    "form_kv": "Name: {NAME}\nAddress: {ADDR}\nPhone: {PHONE}\nEmail: {EMAIL}",
    "card_only": "charge {CARD} again, the loyalty card {~LOYALTY} should not be charged",
    "iban_only": "Überweisung an {IBAN}, Verwendungszweck {~INT}",
    "ip_only": "fail2ban banned {IP} after 5 tries",
    "key_env": "export STRIPE_SECRET={KEY}",
    "greeting_name": "Hi {FIRST}, thanks for the report! Can you send the logs?",
}

DEV_NEG = {
    "n_headers": "Which header should a mailing list set, Reply-To or Sender? And is Signed-off-by required?",
    "n_de_salutation": "Ihre Bestellung wurde versandt. Mit freundlichen Grüßen, Ihr Kundenservice",
    "n_msgid": "The bounce quotes Message-ID: <{~MSGID}>, how do I trace it?",
    "n_loyalty": "My loyalty number {~LOYALTY} didn't earn points on order {~INT}.",
    "n_csv_header": "id,first_name,last_name,email,phone\n(no rows yet, the import failed)",
    "n_semver": "Bumped serde from {~SEMVER} to {~SEMVER}; CI is green.",
    "n_trace": 'Traceback (most recent call last):\n  File "/usr/lib/python3/dist-packages/apt/cache.py", line {~INT}, in open\nSystemError: E:dpkg was interrupted',
    "n_gitconfig": "[core]\n\tautocrlf = input\n[pull]\n\trebase = true",
    "n_json": '{{"status": "ok", "count": {~INT}, "next": null, "updated": "{~ISO}"}}',
    "n_recipe": "How long should I rest a steak after grilling it?",
    "n_city": "Is Madrid or Lisbon better for a week in {~MONTH}?",
    "n_tracking": "Tracking {~TRACK} says delivered but nothing arrived.",
}
HELD_NEG = {
    "n_trailers": "Our CONTRIBUTING.md asks for Signed-off-by and Co-authored-by trailers; what is the difference from Reviewed-by?",
    "n_de_letter": "Sehr geehrte Damen und Herren, vielen Dank für Ihre Anfrage. Ihr Team vom Support",
    "n_msgid2": "In-Reply-To: <{~MSGID}>\nReferences: <{~MSGID}>\n\nwhy does threading break?",
    "n_points": "Bonus card {~LOYALTY}, points balance {~INT}.",
    "n_wsl_sys": "ls /mnt/c/Windows/System32/drivers/etc shows hosts but WSL ignores it",
    "n_author_field": "What goes in the Author: field of a Debian control file?",
    "n_table": "| col | type |\n|-----|------|\n| id | int |\n| name | text |",
    "n_hash": "sha256 {~SHA256} matches the release page",
    "n_fr": "Bonjour, pouvez-vous m'expliquer la différence entre « tu » et « vous » ?",
    "n_invoice": "Invoice {~INT} due {~ISO}, amount {~MONEY}",
    "n_uuid": "Request {~UUID} timed out at {~ISO}",
    "n_weather": "Will it rain in Helsinki or Oslo tomorrow?",
}

SPLITS = {
    "dev": (DEV_TEMPLATES, DEV_NEG, DEV_LOCALES),
    "heldout": (HELD_TEMPLATES, HELD_NEG, HELD_LOCALES),
}

PATH_TAILS = ["projects/app/main.py", "Documents/Steuer/2024.pdf", "source/repos/Api/Program.cs",
              "AppData/Local/Temp/build.log", "Desktop/export.csv", "work/etl/load.py",
              "OneDrive/Bilder/img_0042.jpg", "go/src/tool/main.go"]


def luhn_ok(d):
    s, alt = 0, False
    for ch in reversed(d):
        x = int(ch)
        if alt:
            x = x * 2 - 9 if x > 4 else x * 2
        s += x
        alt = not alt
    return s % 10 == 0


def luhn_complete(body):
    for c in "0123456789":
        if luhn_ok(body + c):
            return body + c
    raise AssertionError


class Gen:
    def __init__(self, seed, locales):
        self.r = random.Random(seed)
        self.locales = locales
        self.fakers = {}
        for loc in sorted(set(locales) | {"en_US"}):
            f = Faker(loc)
            f.seed_instance(self.r.randrange(1 << 30))
            self.fakers[loc] = f
        self.loc = locales[0]

    @property
    def f(self):
        return self.fakers[self.loc]

    # -- names ---------------------------------------------------------------------------
    def _clean(self, s):
        # Faker occasionally yields titles or suffixes; keep the bare name.
        return re.sub(r"\s+", " ", s).strip()

    def FIRST(self, _v=None):
        return self._clean(self.f.first_name())

    def LAST(self, _v=None):
        return self._clean(self.f.last_name())

    def NAME(self, _v=None):
        first, last = self.FIRST(), self.LAST()
        if self.loc in CJK_NOSPACE:
            return last + first
        if self.loc == "ja_JP":
            return last + self.r.choice([" ", "", "\u3000"]) + first
        if self.loc in FAMILY_FIRST:
            return f"{last} {first}"
        if self.loc in ("ru_RU", "uk_UA") and self.r.random() < 0.5:
            return self._clean(self.f.name())  # family, given, patronymic
        if self.r.random() < 0.15:
            return f"{first} {self.FIRST()[0]}. {last}"
        return f"{first} {last}"

    # -- addresses -----------------------------------------------------------------------
    def _addr_lines(self):
        r, loc = self.r, self.loc
        if loc in ("ru_RU", "uk_UA") and r.random() < 0.6:
            kind = r.choice(["ул.", "пер.", "просп.", "улица", "бул."])
            street = self.f.street_title() if hasattr(self.f, "street_title") else self.f.last_name()
            lines = [f"{kind} {street}, д. {r.randint(1, 120)}" + (f", кв. {r.randint(1, 300)}" if r.random() < 0.6 else ""),
                     f"{self.f.city_name() if hasattr(self.f, 'city_name') else self.f.city()}, {self.f.postcode()}"]
            if r.random() < 0.5:
                lines.reverse()
            return lines
        if loc == "da_DK" and r.random() < 0.5:
            return [f"{self.f.street_name()} {r.randint(1, 200)}, {r.randint(1, 5)}. th.", f"{self.f.postcode()} {self.f.city()}"]
        if loc == "es_ES" and r.random() < 0.5:
            kind = r.choice(["Calle", "C/", "Avda.", "Paseo", "Plaza"])
            return [f"{kind} {self.f.last_name()}, {r.randint(1, 99)}, {r.randint(1, 8)}º {r.choice('ABCD')}", f"{self.f.postcode()} {self.f.city()}"]
        raw = self.f.address()
        return [ln.strip().rstrip(",") for ln in raw.split("\n") if ln.strip()]

    def ADDR(self, _v=None):
        return ", ".join(self._addr_lines())

    def ADDRML(self, _v=None):
        return "\n".join(self._addr_lines())

    # -- phones --------------------------------------------------------------------------
    def PHONE(self, variant=None):
        r = self.r
        c = r.random()
        if variant == "nat" or (variant is None and c < 0.35):
            d = lambda n: "".join(r.choice(string.digits) for _ in range(n))
            p = r.choice([
                lambda: f"01{r.choice('567')}{r.randint(0, 9)}/{d(7)}",         # German mobile
                lambda: f"0{r.randint(30, 89)}/{d(3)} {d(4)}",                  # German landline
                lambda: f"{r.randint(30, 89)}/{d(3)} {d(4)}",                   # area code without trunk 0
                lambda: f"0{r.randint(6, 7)} {d(2)} {d(2)} {d(2)} {d(2)}",      # French
                lambda: f"{r.randint(6, 7)}{d(2)} {d(2)} {d(2)} {d(2)}",        # Spanish mobile
                lambda: f"+44 7{d(3)} {d(6)}",
                lambda: f"({d(3)}) {d(3)}-{d(4)}",
                lambda: f"+7 ({r.randint(900, 999)}) {d(3)}-{d(2)}-{d(2)}",
                lambda: f"0{r.randint(3, 9)}0-{d(4)}-{d(4)}",                   # Japanese mobile
                lambda: f"010-{d(4)}-{d(4)}",                                   # Korean mobile
                lambda: f"+45 {d(2)} {d(2)} {d(2)} {d(2)}",
                lambda: f"+358 {r.randint(40, 50)} {d(3)} {d(4)}",
            ])()
        elif variant == "bare":
            p = str(r.randint(2, 9)) + "".join(r.choice(string.digits) for _ in range(9))
        else:
            p = self.f.phone_number()
        # one extension at most (some Faker formats carry their own `x1234`)
        if "x" not in p and (variant == "ext" or (variant is None and r.random() < 0.08)):
            p += r.choice([f";ext={r.randint(10, 999)}", f" ext. {r.randint(10, 999)}", f" x{r.randint(10, 9999)}"])
        return p

    def PHONEBARE(self, _v=None):
        return self.PHONE("bare")

    # -- structured ----------------------------------------------------------------------
    def SSN(self, _v=None):
        s = self.fakers["en_US"].ssn()
        return s if self.r.random() < 0.8 else s.replace("-", " ")

    def NATID(self, _v=None):
        # the record's locale's own national person number, whatever Faker calls its ssn
        try:
            return self.f.ssn()
        except (AttributeError, NotImplementedError):
            return self.fakers["en_US"].ssn()

    def SSNBARE(self, _v=None):
        return self.fakers["en_US"].ssn().replace("-", "")

    def EMAIL(self, _v=None):
        r = self.r
        f = self.f
        if r.random() < 0.5:
            user = self.fakers["en_US"].user_name() if self.loc in CJK_NOSPACE | {"ja_JP", "ru_RU", "uk_UA", "el_GR"} else f.user_name()
            user = re.sub(r"[^A-Za-z0-9._+-]", "", user) or "mail"
            return f"{user}{r.choice(['', '+news', str(r.randint(1, 99))])}@{self.fakers['en_US'].domain_name()}"
        return self.fakers["en_US"].email()

    def CARD(self, _v=None):
        r = self.r
        prefix = r.choice(["4", "51", "55", "2221", "37", "6011", "jcb"])
        if prefix == "jcb":
            prefix = str(r.randint(3528, 3589))  # the JCB range
        n = 15 if prefix == "37" else 16
        body = prefix + "".join(r.choice(string.digits) for _ in range(n - len(prefix) - 1))
        num = luhn_complete(body)
        if n == 16 and r.random() < 0.5:
            sep = r.choice([" ", "-"])
            num = sep.join(num[i:i + 4] for i in range(0, 16, 4))
        return num

    def IBAN(self, _v=None):
        loc = self.r.choice(["de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pl_PL", "pt_PT", "fi_FI", "da_DK", "cs_CZ", "ro_RO"])
        if loc not in self.fakers:
            # Seeded like the rest: an unseeded Faker made the splits differ from run to run.
            self.fakers[loc] = Faker(loc)
            self.fakers[loc].seed_instance(self.r.randrange(1 << 30))
        f = self.fakers[loc]
        s = f.iban()
        if self.r.random() < 0.5:
            s = " ".join(s[i:i + 4] for i in range(0, len(s), 4))
        return s

    def IP(self, _v=None):
        f = self.fakers["en_US"]
        return f.ipv4_public() if self.r.random() < 0.7 else f.ipv6()

    def KEY(self, _v=None):
        r = self.r
        al = string.ascii_letters + string.digits
        rnd = lambda n, a=al: "".join(r.choice(a) for _ in range(n))
        return r.choice([
            lambda: "ghp_" + rnd(36), lambda: "sk_live_" + rnd(24), lambda: "AKIA" + rnd(16, string.ascii_uppercase + "234567"),
            lambda: "glpat-" + rnd(20), lambda: "xoxp-" + rnd(11, string.digits) + "-" + rnd(12, string.digits) + "-" + rnd(32),
            lambda: "sk-" + rnd(48), lambda: "hf_" + rnd(34),
        ])()

    def _user(self):
        r = self.r
        c = r.random()
        if c < 0.4:
            u = self.fakers["en_US"].user_name()
        elif c < 0.8:
            u = self.FIRST()
            if not u.isascii():
                u = self.fakers["en_US"].first_name()
        else:
            u = self.fakers["en_US"].first_name() + "." + self.fakers["en_US"].last_name()
        return u

    def PATH(self, _v=None):
        u, tail = self._user(), self.r.choice(PATH_TAILS)
        style = self.r.choice(["win", "home", "mac"])
        if style == "win":
            return f"C:\\Users\\{u}\\" + tail.replace("/", "\\")
        return (f"/home/{u}/" if style == "home" else f"/Users/{u}/") + tail

    def WSLPATH(self, _v=None):
        return f"/mnt/{self.r.choice('cd')}/Users/{self._user()}/{self.r.choice(PATH_TAILS)}"

    # -- decoys --------------------------------------------------------------------------
    def DECOY(self, kind):
        r = self.r
        d = lambda n: "".join(r.choice(string.digits) for _ in range(n))
        h = lambda n: "".join(r.choice("0123456789abcdef") for _ in range(n))
        if kind == "INT":
            return str(r.randint(1, 9999))
        if kind == "YEAR":
            return str(r.randint(1950, 2005))
        if kind == "SEMVER":
            return f"{r.randint(0, 9)}.{r.randint(0, 40)}.{r.randint(0, 20)}"
        if kind == "GITSHA":
            return h(40)
        if kind == "SHA256":
            return h(64)
        if kind == "UUID":
            return f"{h(8)}-{h(4)}-4{h(3)}-a{h(3)}-{h(12)}"
        if kind == "MSGID":
            return r.choice([f"{d(14)}.{h(8)}@mail.gmail.com", f"CA+{h(20)}@mail.example.org",
                             f"{h(8)}-{h(4)}-{h(4)}@{r.choice(['eurprd04.prod.outlook.com', 'mx.example.net', 'lists.debian.org'])}"])
        if kind == "LOYALTY":
            # Loyalty and gift-card numbers start outside the card networks' ranges; half pass Luhn.
            body = r.choice(["9", "8", "7", "60"]) + d(r.randint(11, 15))
            return luhn_complete(body) if r.random() < 0.5 else body + d(1)
        if kind == "TRACK":
            return r.choice([f"1Z{d(16)}", f"JJD{d(18)}", d(12)])
        if kind == "CLOCK":
            return f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"
        if kind == "DMY":
            return f"{r.randint(1, 28):02d}/{r.randint(1, 12):02d}/{r.randint(20, 25)}"
        if kind == "ISO":
            return f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
        if kind == "GITDATE":
            return f"Tue Mar {r.randint(1, 28)} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:11 2025 +0100"
        if kind == "MONEY":
            return f"{r.randint(10, 9999)}.{d(2)} EUR"
        if kind == "MONTH":
            return r.choice(["May", "June", "October"])
        if kind == "CITY":
            return self.f.city()
        raise KeyError(kind)

    def fill(self, tpl):
        out, spans, decoys, pos, length = [], [], [], 0, 0
        for m in re.finditer(r"\{\{|\}\}|\{(~?)([A-Z]+)(?::([a-z]+))?\}", tpl):
            lit = tpl[pos:m.start()]
            out.append(lit)
            length += len(lit)
            pos = m.end()
            if m.group(0) in ("{{", "}}"):
                out.append(m.group(0)[0])
                length += 1
                continue
            if m.group(1):
                v = self.DECOY(m.group(2))
                decoys.append({"start": length, "end": length + len(v), "kind": m.group(2), "value": v})
            else:
                slot = m.group(2)
                v = getattr(self, slot)(m.group(3))
                typ = {"NAME": "PERSON", "FIRST": "PERSON", "LAST": "PERSON", "ADDR": "ADDRESS",
                       "ADDRML": "ADDRESS", "PHONEBARE": "PHONE", "SSNBARE": "SSN", "NATID": "SSN", "CARD": "CREDIT_CARD",
                       "IP": "IP_ADDRESS", "KEY": "API_KEY", "PATH": "FILE_PATH", "WSLPATH": "FILE_PATH"}.get(slot, slot)
                spans.append({"start": length, "end": length + len(v), "type": typ, "value": v})
            out.append(v)
            length += len(v)
        out.append(tpl[pos:])
        return "".join(out), spans, decoys


def generate(split, n, seed, neg_frac):
    templates, negs, locales = SPLITS[split]
    g = Gen(seed, locales)
    tnames, nnames = sorted(templates), sorted(negs)
    for i in range(n):
        g.loc = g.r.choice(locales)
        if g.r.random() < neg_frac:
            name = g.r.choice(nnames)
            text, spans, decoys = g.fill(negs[name])
            kind = "negative"
        else:
            name = g.r.choice(tnames)
            text, spans, decoys = g.fill(templates[name])
            kind = "pii"
        for s in spans + decoys:
            assert text[s["start"]:s["end"]] == s["value"], (name, s)
        yield {"id": i, "kind": kind, "template": f"{split}:{name}", "locale": g.loc, "text": text,
               "spans": spans, "decoys": decoys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=sorted(SPLITS), required=True)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--neg-frac", type=float, default=0.2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    assert not set(DEV_LOCALES) & set(HELD_LOCALES)
    assert not set(DEV_TEMPLATES) & set(HELD_TEMPLATES)
    with open(a.out, "w", encoding="utf-8") as f:
        for rec in generate(a.split, a.n, a.seed, a.neg_frac):
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
