"""Writes tests/data/tokenizer_corpus.json, the strings tests/test_tokenizers.py encodes with run
and with the models' own tokenizers (through node). Hand-written strings plus small generators;
the JSON is committed, this script only documents how it was made:

    /usr/bin/python3 tests/data/tokenizer_corpus.py > tests/data/tokenizer_corpus.json

Left out on purpose:
- U+0085 (NEXT LINE) and U+FEFF (ZERO WIDTH NO-BREAK SPACE): JavaScript's \\s, which the node
  reference uses, counts U+FEFF as whitespace and not U+0085; the engines the models were
  published with (Oniguruma in Hugging Face tokenizers, Rust's regex in tiktoken) follow
  Unicode's White_Space, the other way round.
- Special-token text ("<|endoftext|>", "<s>", "<|im_start|>", ...): transformers turns it into
  the special token, run never does (a typed special token is text); tested elsewhere.
- Code points newer than Python's unicodedata (14.0 here): export.py writes the class tables
  from it, node's ICU is newer. check() below refuses unassigned code points.
- NUL (run's texts are C strings) and invalid UTF-8 (not representable in JSON).
"""
import json
import random
import sys
import unicodedata

# ---------------------------------------------------------------------------
# English prose, punctuation, casing
ENGLISH = [
    "Hello world!",
    "Hello, world.",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "It was the best of times, it was the worst of times, it was the age of wisdom...",
    "Call me Ishmael. Some years ago - never mind how long precisely - having little money.",
    "\"Quoted text,\" she said, 'and single quotes.'",
    "Mr. Smith went to Washington D.C. on Jan. 5th at 3:30 p.m.",
    "e-mail: someone@example.com, web: https://www.example.org/path?q=1&lang=en#top",
    "Wait... what?! Really?!?",
    "semi;colon:colon,comma.period!bang?question",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "iPhone McDonald HelloWorld XMLHttpRequest camelCaseName snake_case_name kebab-case-name",
    "ALLCAPS lowercase Titlecase mIxEd",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "Supercalifragilisticexpialidocious!",
    "I'm",
    "a",
    "A",
    "?",
    "hello",
    " hello",
    "  hello",
    "hello ",
    "hello  ",
    "Hello World Hello World Hello World",
    "The year 1999 and the year 2024; 42 is the answer; pi is 3.14159.",
    "(parentheses) [brackets] {braces} <angles>",
    "#hashtag @mention $dollar %percent ^caret &ampersand *star",
    "under_score__double___triple",
    "tab\tseparated\tvalues",
    "line one\nline two\nline three",
    "Windows line\r\nendings\r\nhere\r\n",
    "old Mac\rline\rendings",
    "trailing newline\n",
    "\nleading newline",
    "mixed \n\t \r\n whitespace \t\t\n",
    "The café's crème brûlée was naïve.",
    "Dear Sir/Madam, I am writing to you regarding your letter of 3/4/2021.",
    "She sells sea-shells by the sea-shore; the shells she sells are sea-shells, I'm sure.",
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
]

# ---------------------------------------------------------------------------
# Contractions in every case (the patterns' 's|'t|'re|'ve|'m|'ll|'d, case-insensitive in
# Llama 3 and o200k, lower-case only in GPT-2 and Qwen), in and out of words.
CONTRACTIONS = [
    "I'm you're he's she'd we've they'll it't",
    "I'M YOU'RE HE'S SHE'D WE'VE THEY'LL IT'T",
    "You'Re We'Ve They'Ll She'D He'S I'M",
    "you'rE we'vE they'lL",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "'Re 'rE 'Ve 'vE 'Ll 'lL",
    "'s",
    "'S",
    "'",
    "''",
    "'''s",
    "don't DON'T Don'T can't won't shouldn't've",
    "John's book, JOHN'S BOOK, the dogs' bowls",
    "rock'n'roll o'clock ma'am y'all",
    "it's it’s IT’S",
    "x's's's",
    "1's 2'S 3're",
    " 's ' s 'sx 'res 'ved",
    "'ll'll'LL'Ll",
    "日本's 東京'S",
    "Ünïcödé's ÜNÏCÖDÉ'S",
    "'tis 'Twas",
    "hello'", "'hello'", "''hello''",
]

# ---------------------------------------------------------------------------
# Other scripts (at least 15); NFC as typed.
SCRIPTS = [
    "Le cœur a ses raisons que la raison ne connaît point.",               # French
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",    # German
    "¿Dónde está la biblioteca? ¡Olé! El niño comió piña.",                # Spanish
    "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",       # Polish
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",                             # Czech
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ, ố ồ ổ ỗ ộ, ướ ườ.",                 # Vietnamese
    "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul ıIiİ",         # Turkish
    "Árvíztűrő tükörfúrógép",                                               # Hungarian
    "Þetta er íslenska: ð þ æ ö.",                                          # Icelandic
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αθήνα ΑΘΗΝΑ αθήνα",                # Greek
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",           # Russian
    "ПРИВЕТ МИР привет мир Привет Мир",                                    # Russian cases
    "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",               # Ukrainian
    "Բարեւ աշխարհ, ինչպես ես:",                                             # Armenian
    "გამარჯობა მსოფლიო, როგორ ხარ?",                                        # Georgian
    "שלום עולם! מה שלומך היום?",                                            # Hebrew
    "עִבְרִית עם ניקוד: בְּרֵאשִׁית בָּרָא",                                  # Hebrew with points
    "مرحبا بالعالم! كيف حالك اليوم؟",                                       # Arabic
    "اَلْعَرَبِيَّةُ مع التشكيل",                                               # Arabic with harakat
    "سلام دنیا، حال شما چطور است؟ ۱۲۳۴۵",                                    # Persian
    "नमस्ते दुनिया! आप कैसे हैं? ०१२३४५६७८९",                                 # Hindi (Devanagari)
    "ওহে বিশ্ব, তুমি কেমন আছ?",                                              # Bengali
    "வணக்கம் உலகம், நீங்கள் எப்படி இருக்கிறீர்கள்?",                        # Tamil
    "హలో ప్రపంచం, మీరు ఎలా ఉన్నారు?",                                       # Telugu
    "ಹಲೋ ವರ್ಲ್ಡ್ ಕನ್ನಡ",                                                      # Kannada
    "ഹലോ വേൾഡ് മലയാളം",                                                      # Malayalam
    "ਸਤਿ ਸ੍ਰੀ ਅਕਾਲ ਦੁਨੀਆ",                                                     # Gurmukhi
    "નમસ્તે દુનિયા ગુજરાતી",                                                   # Gujarati
    "ආයුබෝවන් ලෝකය",                                                         # Sinhala
    "สวัสดีชาวโลก คุณสบายดีไหม ๑๒๓",                                         # Thai
    "ສະບາຍດີ ໂລກ",                                                           # Lao
    "សួស្តី​ពិភពលោក",                                                         # Khmer (with U+200B)
    "မင်္ဂလာပါ ကမ္ဘာလောက",                                                   # Myanmar
    "བཀྲ་ཤིས་བདེ་ལེགས། འཛམ་གླིང་།",                                             # Tibetan
    "ሰላም ልዑል፣ እንዴት ነህ?",                                                   # Ethiopic (Amharic)
    "你好，世界！今天天气很好。",                                               # Chinese simplified
    "我們的國家歷史悠久，文化燦爛。",                                           # Chinese traditional
    "こんにちは世界！カタカナとひらがなと漢字。",                                 # Japanese
    "ｶﾀｶﾅ　半角と全角　スペース",                                               # half/fullwidth kana, U+3000
    "안녕하세요 세계! 한국어 텍스트입니다.",                                      # Korean Hangul
    "Сайн байна уу? ᠮᠣᠩᠭᠣᠯ",                                                  # Mongolian
    "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",                                                             # Cherokee
    "ᐊᐃᓐᓇᖅ ᐃᓄᒃᑎᑐᑦ",                                                           # Canadian syllabics
    "Ⲁⲛⲟⲕ ⲡⲉ ⲡⲓⲣⲉⲙⲛⲭⲏⲙⲓ",                                                      # Coptic
    "ᚠᚢᚦᚨᚱᚲ ᚷᚹᚺᚾᛁᛃ",                                                           # Runic
    "𐌰𐌱𐌲𐌳 Gothic",                                                           # Gothic (SMP letters)
    "Mixed: English, Русский, 中文, العربية, हिन्दी, 日本語, 한국어.",
]

# ---------------------------------------------------------------------------
# NFC and decomposed accents: each of these also appears in NFD form (generated below),
# plus hand-made cases of canonical reordering, singletons and composition exclusions.
ACCENTED = [
    "café naïve résumé façade jalapeño",
    "Ångström Ærøskøbing Øresund",
    "élève ÉLÈVE Élève",
    "Tiếng Việt ắ ằ ẳ ẵ ặ",
    "한국어 텍스트 각 갂 힣",
    "がぎぐげご パピプペポ",
    "ǅemal ǈubljana ǋovak",
    "ḍḥṣṭẓ ṃṇ",
]
HAND_NORMALIZATION = [
    "a\u0301",                      # a + combining acute -> á
    "A\u030a",                      # A + ring -> Å
    "\u212b",                       # ANGSTROM SIGN (singleton) -> Å
    "\u2126 \u212a",                # OHM SIGN, KELVIN SIGN (singletons)
    "q\u0323\u0307 q\u0307\u0323",  # marks in both orders (canonical reordering)
    "a\u0323\u0302 a\u0302\u0323",  # ậ either way
    "e\u0301\u0301\u0301",           # repeated marks
    "\u0301start with a mark",
    "mark after space \u0301 and tab\t\u0308",
    "\u0958\u0959 \u0915\u093c",    # Devanagari qa/khha: composition exclusions
    "\u1100\u1161\u11a8 \u1100\u1161",  # conjoining jamo -> 각, 가
    "\u1112\u1161\u11ab\u1100\u1173\u11af",  # 한글 decomposed
    "\u0344 \u0340\u0341",          # singleton-decomposing combining marks
    "\u00c5\u030a",                 # precomposed plus an extra mark
    "o\u0308\u0304 \u022b",        # ȫ both ways
    "\u0f73 \u0f75",                # Tibetan vowel signs with decompositions
    "\u1e9b\u0323",                 # long s with dot above + dot below
    "\uff21\uff22\uff23 \ufb01 \u2460",  # fullwidth, ligature, circled 1 (compatibility only: NFC keeps)
]

# ---------------------------------------------------------------------------
# Whitespace: runs of spaces, tabs, CR LF, Unicode spaces (not U+0085, U+FEFF)
WHITESPACE = [
    "", " ", "\t", "\n", "\r", "\r\n", "\n\n", "\r\n\r\n", "\n\n\n\n",
    "\x0b", "\x0c", "\x1c\x1d\x1e\x1f",
    "a\x0bb\x0cc", "x\x1cy\x1dz\x1e!\x1f?",
    "a \n b", "a \r\n b", "a\t\nb", "a\n\tb", "a \t \t b",
    "    indented four", "\tindented tab", "\t\tdouble tab",
    "word\u00a0nbsp\u00a0\u00a0two",
    "en\u2002em\u2003thin\u2009hair\u200afigure\u2007",
    "ideographic\u3000space\u3000\u3000",
    "line\u2028separator\u2029paragraph",
    "ogham\u1680space narrow\u202fnbsp math\u205fspace",
    "zero\u200bwidth\u200cnon\u200djoiner",
    "mongolian\u180evowel separator",
    "spaces before newline   \nand after\n   x",
    "\n \n \n", " \n", "\n ", " \r\n ", "\t \n",
    "end with spaces   ", "end with tab\t", "   ", "\t\t\t", " \t ",
]
for n in range(1, 17):
    WHITESPACE.append("a" + " " * n + "b")
for n in (2, 3, 5, 8, 13, 32):
    WHITESPACE.append(" " * n)
    WHITESPACE.append("x" + "\n" * n + "y")
    WHITESPACE.append("x" + "\t" * n + "y")
WHITESPACE.append("x" + "\r\n" * 4 + "y")
WHITESPACE.append("a \u00a0 b\u00a0 \u00a0c")

# ---------------------------------------------------------------------------
# Digits of every length, in and around words, other scripts' digits, numeric symbols
DIGITS = ["1234567890123456789012345"[:n] for n in range(1, 26)]
DIGITS += [" " + "9" * n for n in (1, 2, 3, 4, 5, 6, 7)]
DIGITS += ["x" + "0" * n + "y" for n in (1, 3, 4, 6, 7)]
DIGITS += [
    "1,234,567.89", "3.14159265358979", "-42 +17 1e10 6.02e23 0x1F 0b1010",
    "2024-01-15T10:30:00Z", "192.168.0.1:8080", "+1 (555) 123-4567",
    "abc123def456", "123abc", "v1.2.3-rc4", "COVID19 H2O CO2 MP3",
    "٠١٢٣٤٥٦٧٨٩ ١٢٣", "०१२३४५६७८९", "১২৩ ௧௨௩ ๑๒๓", "１２３４５ fullwidth",
    "x² y³ ½ ¼ ¾ ⅓", "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ ⅻ", "① ② ⑩ ⑳", "𝟎𝟏𝟐 𝟙𝟚𝟛", "1st 2nd 3rd 4th 100th",
    "$100 €50 ¥1000 £20.50 ₹500", "50% 3/4 1:2 10x",
]

# ---------------------------------------------------------------------------
# Code
CODE = [
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, world!\\n\");\n    return 0;\n}\n",
    "const add = (a, b) => a + b; // arrow function\nconsole.log(add(1, 2));",
    "if (x != NULL && y->next == NULL) { *p++ = '\\0'; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<html><head><title>Test</title></head><body><p class=\"x\">Hi</p></body></html>",
    "<table><tr><td>1</td></tr></table> <h1>Title</h1> <br/>",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
    "x = [i**2 for i in range(100) if i % 3 == 0]",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}",
    "    \n    \n\tmixed indentation\n        eight spaces\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "// comment\n/* block\n   comment */\n# hash comment\n-- sql comment",
    "path/to/file.txt C:\\Windows\\System32 ~/.bashrc ../../up",
    "```python\nprint('fenced')\n```",
    "=== --- *** ___ ~~~ ``` ''' \"\"\"",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "\\n\\t\\r\\\\ escaped backslashes",
    "foo.bar().baz[0]->qux::quux",
    "if(a){b}else{c}",
    "<|not_a_special_token|> <<SYS>> [INST] [/INST] </ s> < s>",
]

# ---------------------------------------------------------------------------
# Emoji: skin tones, ZWJ sequences, flags, keycaps, variation selectors
EMOJI = [
    "😀😃😄😁😆😅🤣😂",
    "👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
    "👋🏽 Hello! 🙏🏿",
    "👨‍👩‍👧‍👦 family",
    "👩🏾‍💻 👨🏻‍🔬 🧑🏽‍🚀",
    "🏳️‍🌈 🏳️‍⚧️ 🏴‍☠️",
    "🇫🇷🇯🇵🇺🇸🇩🇪🇧🇷🇮🇳",
    "🇺🇳 flags 🇪🇺",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁷󠁬󠁳󠁿",
    "1️⃣ 2️⃣ #️⃣ *️⃣",
    "❤️ ❤ ♥️ ☺️ ✔️",
    "I ❤️ NY 🗽",
    "🤷‍♀️ 🤷🏼‍♂️ 🙋‍♀️",
    "emoji🙂inside🙂words",
    "🐍🦀🐘🐧",
    "👩‍❤️‍💋‍👨 💑🏽",
]

# ---------------------------------------------------------------------------
# Symbols and mathematical letters
SYMBOLS = [
    "© ® ™ § ¶ † ‡ • … ‰ ′ ″",
    "← → ↑ ↓ ↔ ⇒ ⇔ ↦",
    "∀x ∈ ℝ: ∃y ∉ ∅, x ≤ y ≠ ∞",
    "∑ᵢ aᵢ = ∫₀¹ f(x) dx ≈ √2 ± ∂",
    "𝐀𝐁𝐂 𝐚𝐛𝐜 𝑨𝑩𝑪 𝒶𝒷𝒸 𝔄𝔅ℭ 𝔸𝔹ℂ 𝕒𝕓𝕔",
    "𝛼𝛽𝛾 𝚨𝚩𝚪 ℕ ℤ ℚ ℝ ℂ ℵ₀",
    "ℎ = 𝑚𝑐² 𝓛 = 𝑇 − 𝑉",
    "─│┌┐└┘├┤┬┴┼ ═║╔╗╚╝",
    "░▒▓█ ▲△▼▽ ●○◆◇ ★☆",
    "♠♣♥♦ ♩♪♫♬ ☀☁☂☃",
    "«guillemets» „German quotes“ “curly” ‘single’",
    "— – ‐ ‑ ‒ ― dash types",
    "¡¿‽⁇⁈",
    "ǅ ǈ ǋ ǲ ᾈ ᾙ",                  # titlecase letters (Lt)
    "ʰ ʲ ʷ ˈ ˌ ː ᵃ ᵇ ᶜ",           # modifier letters (Lm)
    "ªº ƻ ǀ ǁ ǂ ǃ",                 # other letters (Lo)
    "Ｈｅｌｌｏ　Ｗｏｒｌｄ！",
    "ﬁ ﬂ ﬀ ﬃ ﬄ ﬅ ﬆ",
    "℃ ℉ № ℗ ℠ Ω ℮",
    "\u0300\u0301\u0302 bare marks",
    "A\u20dd B\u20de",              # enclosing marks (Me)
    "ि ा ी spacing marks (Mc)",
    "⁰¹²³⁴⁵⁶⁷⁸⁹ ₀₁₂₃₄₅₆₇₈₉",
    "°C µm Å Ω ‰",
    "+-*/=<>^~|&!",
    "....,,,,;;;;::::",
    "!!!???!!!", "?!", "...", "…",
    "—", "--", "---",
    "***bold*** __under__ ~~strike~~",
]

# ---------------------------------------------------------------------------
# o200k tells upper from lower case letters and marks: words in every casing shape
CASING = [
    "HelloWorld helloWorld HELLOworld helloWORLD",
    "ABCdef abcDEF AbCdEf aBcDeF",
    "McDonald'S O'Neill'S iOS macOS IOs",
    "ΑθήναΑΘΗΝΑ αθήναΑθήνα",
    "МоскваМОСКВА москваМосква",
    "ÉcoleÉCOLE écoleÉcole",
    "e\u0301E\u0301e\u0301 E\u0301e\u0301",
    "Straße STRASSE ẞ",
    "ǅemalǄEMAL ǆemal",
    "日本Japan日本JAPAN",
    "a1b2c3 A1B2C3",
    "DON'T Don't don'T",
]


# ---------------------------------------------------------------------------
# Harder cases: merge-rank ties in repeated characters, long combining sequences (canonical
# reordering), format and private-use characters, supplementary-plane ideographs, U+2581
# typed (the SentencePiece space symbol), C0 controls.
HARDER = [
    "a" * 7, "a" * 16, "a" * 33, "ab" * 20, "aab" * 9, "=" * 24, "-" * 40, "!" * 11, "0" * 12,
    "\U0001F600" * 5, "中" * 7, "ーー" * 4, "  " * 9 + "x",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034d A\u0335\u0358",
    "o\u031b\u0323\u0301 u\u0301\u031b\u0323 \u1ee3",   # ợ from three orders of its marks
    "\U00020000\U00020001 \U0002A6D6 CJK extension B",
    "private \ue000\uf8ff use",
    "soft\u00adhyphen lrm\u200emark word\u2060joiner",
    "ctrl\x01\x02\x7f chars\x1b[0m",
    "\n\u0301 mark after newline",
    "\u00a0leading nbsp",
    "   \n\n   \t\t\n \r\n\r\n  x",
    "x \n\n\n y\n\n\n\n z",
    "'s's 'S'S 'sS",
    "I'M'S",
    "A'LL B'Ve c'RE",
    "..., ... ;; ,, .",
    "1.000.000,00 1'000'000",
]


# ---------------------------------------------------------------------------
# Added tokens that are not special (Qwen's <tool_call>, <think>, <|fim_prefix|>; Gemma 3's
# <unusedN>, <mask>, [multimodal]): Hugging Face splits them out of the text before the
# pre-tokenizer and BPE, so typed text produces them. Also near misses that must stay text.
ADDED_TOKENS = [
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>",
    "<|repo_name|>run.c<|file_sep|>README.md",
    "<tool_response>ok</tool_response>",
    "x<think>y</think>z <tool_call><tool_call>",
    "<unused0><unused1> <mask> [multimodal] x<unused6241>y",
    "<tool_call <think </think <unused <unused0 <|fim_prefix| <<think>>",
]


def nfd_variants(strings):
    out = []
    for s in strings:
        d = unicodedata.normalize("NFD", s)
        if d != s:
            out.append(d)
        # NFD words mixed with NFC ones in one string
        words = s.split(" ")
        mixed = " ".join(unicodedata.normalize("NFD", w) if i % 2 else w for i, w in enumerate(words))
        if mixed not in (s, d):
            out.append(mixed)
    return out


def generated():
    """Small generators: every ASCII printable character between letters; each contraction
    suffix after each case of a word; whitespace/punctuation/letter/digit pairings."""
    out = []
    printable = "".join(chr(c) for c in range(0x21, 0x7f))
    out.append(printable)
    out.append(" ".join(printable))
    for i in range(0, len(printable), 12):
        out.append("".join("a" + ch for ch in printable[i:i + 12]) + "a")
    for suffix in ("s", "t", "re", "ve", "m", "ll", "d"):
        out.append(" ".join(w + "'" + sfx for w in ("it", "IT", "It") for sfx in (suffix, suffix.upper(),
                                                                                   suffix.capitalize())))
    pieces = [" ", "  ", "\n", "\t", "a", "Z", "7", "!", "é", "中", "🙂", "'s", "\r\n"]
    for a in pieces:
        out.append("".join(a + b for b in pieces))
    # a longer paragraph (several pre-tokens of every kind in one string)
    out.append(" ".join(ENGLISH[2:8]) + "\n\n" + " ".join(SCRIPTS[:12]) + "\n" + " ".join(DIGITS[20:30]))
    return out


# Pieces the random strings below are made of: letters of several scripts and cases, marks,
# digits, every kind of whitespace, punctuation, contractions, emoji, numbers beyond ASCII,
# added tokens, common words.
PALETTE = (list("aAzZéÉüßçñøåÆŒ") + ["e\u0301", "E\u0301", "a\u0308", "\u0301", "\u0323"] + list("0123456789")
           + [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2009", "\x0b", "\x0c"]
           + list("'\"’`.,;:!?-_/\\()[]{}<>@#$%^&*+=|~")
           + ["'s", "'S", "'re", "'RE", "'Ve", "'ll", "'LL", "'d", "'M", "'t"]
           + list("日本語中文한국어ひらがなカタカナПриветمرحباनमस्तेสวัสดีΩωǅʰ")
           + ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "1️⃣", "½", "²", "①", "٣", "𝐀", "𝑎", "ﬁ", "Ａ", "\u200d",
              "\u200b", "\ue000", "<unused0>", "<tool_call>", "<think>", "<h1>", "<table>"]
           + ["hello", "Hello", "HELLO", "world", "the", " the", "ing", "tion", "123", "2024", "    ", "\t\t"])


def random_strings(n, seed=1):
    """n strings of 1 to 14 palette pieces, from a fixed seed."""
    rng = random.Random(seed)
    return ["".join(rng.choice(PALETTE) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def check(strings):
    seen = set()
    unique = []
    for s in strings:
        for ch in s:
            assert ch not in "\x00\x85\ufeff", repr(s)
            assert unicodedata.category(ch) != "Cn" or ch in "", f"unassigned {ord(ch):04X} in {s!r}"
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


def main():
    strings = (ENGLISH + CONTRACTIONS + SCRIPTS + ACCENTED + nfd_variants(ACCENTED + SCRIPTS[:10])
               + HAND_NORMALIZATION + WHITESPACE + DIGITS + CODE + EMOJI + SYMBOLS + CASING + HARDER + ADDED_TOKENS
               + generated() + random_strings(150))
    strings = check(strings)
    json.dump(strings, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")
    print(f"{len(strings)} strings", file=sys.stderr)


if __name__ == "__main__":
    main()
