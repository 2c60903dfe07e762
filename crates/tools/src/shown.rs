//! What a person deciding a call is shown of its arguments (docs/approvals.md), on every
//! path alike (`GET /v1/approvals`, a stream's event, an MCP host's dialog): one text that
//! stays within a bound and in which no part of the arguments can hide another.
//!
//! - Every character the code chose that is not printable ASCII is written as `\u{...}`
//!   ([`printable`]): a right-to-left override, an invisible or a look-alike character
//!   cannot make the text read as something else.
//! - Every key at every depth and every value but a long string is shown whole; only long
//!   strings are cut, each to an even share of what is left (a short one is never cut), and
//!   the cut is said after the string's closing quote (`"xxx"...(N more bytes)`), where
//!   no string can write it: inside quotes, a `"` the code wrote is `\"`.
//! - When even that does not fit, nothing is shown but a sentence that says so and where
//!   the arguments are whole: never a part of them that would look like all of them.

use airlock_api::Shown;
use serde_json::{Map, Value};

/// A string whose literal (quotes and escapes included) is at most this long is never cut,
/// and a longer one keeps at least this much.
const SHORT: usize = 64;

/// What is shown of one call's arguments.
#[derive(Debug)]
pub(crate) struct Preview {
    pub text: String,
    pub shown: Shown,
    /// Whether a key or a string holds anything but printable ASCII (the text escapes it).
    pub escaped: bool,
}

/// `text` with every character but printable ASCII written as `\u{...}` (hex): nothing that
/// could turn, hide or overwrite what a person reads (bidi controls, invisible characters,
/// line breaks, terminal escapes), nor a letter that only looks like another.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        show(c, &mut out);
    }
    out
}

fn is_printable(c: char) -> bool {
    c == ' ' || c.is_ascii_graphic()
}

fn show(c: char, out: &mut String) {
    if is_printable(c) {
        out.push(c);
    } else {
        out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
    }
}

/// One character inside a JSON string literal, as shown: escaped as JSON escapes it (as
/// serde_json writes it), then as [`printable`].
fn literal_char(c: char, out: &mut String) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if c < ' ' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        c => show(c, out),
    }
}

/// `s` as a JSON string literal, shown.
fn literal(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        literal_char(c, out);
    }
    out.push('"');
}

/// The length of `s`'s literal, as shown (without making it: a string of control
/// characters is shown six times as long).
fn literal_len(s: &str) -> usize {
    let mut one = String::new();
    let chars: usize = s
        .chars()
        .map(|c| {
            one.clear();
            literal_char(c, &mut one);
            one.len()
        })
        .sum();
    chars + 2
}

/// The arguments laid out: the text of everything but the strings, with a place for each.
struct Layout<'a> {
    /// Text, then string, then text...: `fixed.len() == strings.len() + 1`.
    fixed: Vec<String>,
    strings: Vec<Str<'a>>,
    escaped: bool,
}

struct Str<'a> {
    value: &'a str,
    /// The length of its whole literal, as shown.
    len: usize,
}

impl Str<'_> {
    /// The least it may take: whole if short, else its first [`SHORT`] bytes and the mark.
    fn least(&self) -> usize {
        if self.len > SHORT {
            SHORT + cut_mark(self.value.len()).len()
        } else {
            self.len
        }
    }
}

impl<'a> Layout<'a> {
    fn push(&mut self, text: &str) {
        self.fixed.last_mut().expect("never empty").push_str(text);
    }

    fn note(&mut self, s: &str) {
        self.escaped |= !s.chars().all(is_printable);
    }

    fn value(&mut self, value: &'a Value) {
        match value {
            Value::Object(map) => self.object(map),
            Value::Array(items) => {
                self.push("[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.push(",");
                    }
                    self.value(item);
                }
                self.push("]");
            }
            Value::String(s) => {
                self.note(s);
                self.strings.push(Str {
                    value: s,
                    len: literal_len(s),
                });
                self.fixed.push(String::new());
            }
            // Numbers, booleans and null as serde_json writes them (ASCII, at most 24 bytes).
            other => self.push(&other.to_string()),
        }
    }

    fn object(&mut self, map: &'a Map<String, Value>) {
        self.push("{");
        for (i, (key, value)) in map.iter().enumerate() {
            if i > 0 {
                self.push(",");
            }
            self.note(key);
            let mut shown = String::new();
            literal(key, &mut shown);
            shown.push(':');
            self.push(&shown);
            self.value(value);
        }
        self.push("}");
    }
}

/// What follows a string cut with `left` of its bytes not shown.
fn cut_mark(left: usize) -> String {
    format!("...({left} more bytes)")
}

/// What an approver is shown of `arguments` within `bound` bytes (but for the sentence said
/// when nothing fits, which names `id`): see the module's docs.
pub(crate) fn preview(arguments: &Map<String, Value>, bound: usize, id: &str) -> Preview {
    let mut layout = Layout {
        fixed: vec![String::new()],
        strings: Vec::new(),
        escaped: false,
    };
    layout.object(arguments);
    let fixed: usize = layout.fixed.iter().map(String::len).sum();
    let whole = fixed + layout.strings.iter().map(|s| s.len).sum::<usize>();
    let room = bound.checked_sub(fixed);
    let Some(level) = room.and_then(|room| level(&layout.strings, room)) else {
        let least = fixed + layout.strings.iter().map(Str::least).sum::<usize>();
        return Preview {
            text: format!(
                "(not shown: every key and every value, long strings cut short, would take \
                 {least} bytes, over the {bound} shown here; read the arguments whole with \
                 GET /v1/approvals/{id})"
            ),
            shown: Shown::TooLarge,
            escaped: layout.escaped,
        };
    };
    let mut text = String::with_capacity(bound.min(whole));
    let mut cut = false;
    let mut fixed = layout.fixed.iter();
    text.push_str(fixed.next().expect("never empty"));
    for (s, after) in layout.strings.iter().zip(fixed) {
        if s.len <= level {
            literal(s.value, &mut text);
        } else {
            cut = true;
            let shown = cut_to(s.value, level, &mut text);
            text.push_str(&cut_mark(s.value.len() - shown));
        }
        text.push_str(after);
    }
    Preview {
        text,
        shown: if cut { Shown::Cut } else { Shown::Whole },
        escaped: layout.escaped,
    }
}

/// The longest literal each string may have so that all of them, with the marks of those
/// cut, fit in `room`: at least [`SHORT`], and at least as long as the longest string not
/// cut (strings are cut longest first, all to the same length). None when they cannot fit.
fn level(strings: &[Str<'_>], room: usize) -> Option<usize> {
    let total: usize = strings.iter().map(|s| s.len).sum();
    if total <= room {
        return Some(usize::MAX);
    }
    let mut longest: Vec<&Str<'_>> = strings.iter().filter(|s| s.len > SHORT).collect();
    longest.sort_by_key(|s| std::cmp::Reverse(s.len));
    // Cut the k longest: what they may take is what the others leave, less their marks.
    let (mut kept, mut marks) = (total, 0);
    for (k, s) in longest.iter().enumerate() {
        kept -= s.len;
        marks += cut_mark(s.value.len()).len();
        // Each cut takes more than its mark adds: a larger k may fit where this one does not.
        let Some(free) = room.checked_sub(kept + marks) else {
            continue;
        };
        let each = free / (k + 1);
        let next = longest.get(k + 1).map_or(SHORT, |n| n.len.max(SHORT));
        if each >= next {
            return Some(each);
        }
    }
    None
}

/// Writes the literal of the longest start of `s` whose literal is at most `max` bytes; how
/// many bytes of `s` it holds.
fn cut_to(s: &str, max: usize, out: &mut String) -> usize {
    let mut room = max.saturating_sub(2);
    let mut one = String::new();
    out.push('"');
    let mut taken = 0;
    for c in s.chars() {
        one.clear();
        literal_char(c, &mut one);
        if one.len() > room {
            break;
        }
        room -= one.len();
        out.push_str(&one);
        taken += c.len_utf8();
    }
    out.push('"');
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shown(args: Value, bound: usize) -> Preview {
        preview(args.as_object().unwrap(), bound, "ap_x")
    }

    #[test]
    fn only_printable_ascii_is_shown() {
        assert_eq!(printable("ok \u{202e}x\r\n"), "ok \\u{202e}x\\u{d}\\u{a}");
        assert_eq!(printable("{\"a\": 1}"), "{\"a\": 1}");
    }

    #[test]
    fn arguments_that_fit_are_their_json_as_sent() {
        let args =
            json!({"to": "bob", "n": [1, 2.5, true, null], "o": {"q": "a\"b\\c\n\u{1}\u{7f}"}});
        let p = shown(args.clone(), 1000);
        assert_eq!(p.text, printable(&args.to_string()));
        assert_eq!(
            p.text,
            r#"{"to":"bob","n":[1,2.5,true,null],"o":{"q":"a\"b\\c\n\u0001\u{7f}"}}"#
        );
        assert_eq!(p.shown, Shown::Whole);
        assert!(p.escaped);
        // Each character shown as it is in the JSON, then made printable.
        for c in [
            '\u{0}',
            '\u{1f}',
            '"',
            '\\',
            '/',
            '\u{202e}',
            '\u{10ffff}',
            'é',
            '\u{2028}',
        ] {
            let args = json!({ "k": format!("a{c}b") });
            let p = shown(args.clone(), 1000);
            assert_eq!(p.text, printable(&args.to_string()), "{c:?}");
            assert!(p.escaped || c == '"' || c == '\\' || c == '/', "{c:?}");
        }
        assert!(!shown(json!({"a": "plain \" text"}), 100).escaped);
        assert!(shown(json!({"\u{2066}": 1}), 100).escaped, "keys too");
    }

    #[test]
    fn a_long_string_hides_no_other_value_at_any_depth() {
        let args = json!({"to": "bob", "amount": 1, "meta": {"note": "x".repeat(20000), "to": "mallory", "amount": 1000000, "deep": [{"k": [false, "short"]}]}});
        let p = shown(args, 16384);
        assert_eq!(p.shown, Shown::Cut);
        let expected = format!(
            r#"{{"to":"bob","amount":1,"meta":{{"note":"{}"...(3742 more bytes),"to":"mallory","amount":1000000,"deep":[{{"k":[false,"short"]}}]}}}}"#,
            "x".repeat(16258)
        );
        assert_eq!(p.text, expected);
        // All the room but the byte the mark was reserved and did not need.
        assert_eq!(p.text.len(), 16383);
        // As the broker's first preview promised: every key of what is sent.
        let args = json!({"body": "a".repeat(150), "to": "attacker@example.com"});
        let p = shown(args, 128);
        assert!(
            p.text
                .ends_with(r#""...(80 more bytes),"to":"attacker@example.com"}"#),
            "{}",
            p.text
        );
    }

    #[test]
    fn long_strings_share_the_room_and_short_ones_are_never_cut() {
        let args = json!({"a": "a".repeat(1000), "b": "b".repeat(300), "c": "c".repeat(100), "d": "d".repeat(60)});
        let p = shown(args, 600);
        // The two longest cut to the same length; `c` fits whole within that length.
        let expected = format!(
            r#"{{"a":"{}"...(814 more bytes),"b":"{}"...(114 more bytes),"c":"{}","d":"{}"}}"#,
            "a".repeat(186),
            "b".repeat(186),
            "c".repeat(100),
            "d".repeat(60)
        );
        assert_eq!(p.text, expected);
        assert_eq!(p.text.len(), 599);
    }

    #[test]
    fn a_string_cannot_pass_for_structure_or_for_the_cut_mark() {
        let fake = r#"x"...(5 more bytes),"to":"mallory"#;
        let p = shown(json!({"note": fake, "to": "bob"}), 1000);
        assert_eq!(
            p.text,
            r#"{"note":"x\"...(5 more bytes),\"to\":\"mallory","to":"bob"}"#
        );
        // Cut, its mark follows the closing quote: what the string wrote stays inside.
        let p = shown(
            json!({"note": format!("{fake}{}", "y".repeat(500)), "to": "bob"}),
            120,
        );
        let expected = format!(
            r#"{{"note":"x\"...(5 more bytes),\"to\":\"mallory{}"...(458 more bytes),"to":"bob"}}"#,
            "y".repeat(42)
        );
        assert_eq!(p.text, expected);
        assert_eq!(p.text.len(), 120);
    }

    #[test]
    fn what_cannot_fit_says_so_and_shows_nothing() {
        // A long key, many keys, deep nesting: never cut, so over the bound nothing is shown.
        let long_key = json!({ "k".repeat(300): 1, "to": "mallory" });
        let many: Map<String, Value> = (0..100).map(|i| (format!("k{i}"), json!(i))).collect();
        let mut deep = json!("mallory");
        for _ in 0..100 {
            deep = json!({ "d": deep });
        }
        for args in [long_key, Value::Object(many), deep] {
            let p = shown(args, 256);
            assert_eq!(p.shown, Shown::TooLarge);
            assert!(p.text.starts_with("(not shown: "), "{}", p.text);
            assert!(p.text.ends_with("GET /v1/approvals/ap_x)"), "{}", p.text);
            assert!(!p.text.contains("mallory"), "{}", p.text);
        }
        // Each long string keeps its first 64 bytes and its mark: ten of them need 891.
        let strings: Map<String, Value> = (0..10)
            .map(|i| (format!("s{i}"), json!("z".repeat(500))))
            .collect();
        let p = shown(Value::Object(strings.clone()), 890);
        assert_eq!(p.shown, Shown::TooLarge);
        assert!(
            p.text.contains("would take 891 bytes, over the 890"),
            "{}",
            p.text
        );
        let p = shown(Value::Object(strings), 891);
        assert_eq!(p.shown, Shown::Cut);
        assert_eq!(p.text.len(), 891);
    }

    #[test]
    fn escapes_count_against_the_bound_and_are_never_split() {
        let p = shown(json!({"k": "\u{202e}".repeat(1000), "to": "bob"}), 300);
        assert_eq!(p.shown, Shown::Cut);
        assert!(
            p.text.len() <= 300 && p.text.is_ascii() && p.escaped,
            "{}",
            p.text
        );
        let expected = format!(
            r#"{{"k":"{}"...(2904 more bytes),"to":"bob"}}"#,
            "\\u{202e}".repeat(32)
        );
        assert_eq!(p.text, expected);
    }

    /// A preview read back: a cut string becomes `{"$cut": its start, "$left": bytes}`.
    fn read_back(text: &str) -> Value {
        let mut at = 0;
        let value = read_value(text.as_bytes(), &mut at);
        assert_eq!(at, text.len(), "trailing text in {text}");
        value
    }

    fn read_value(b: &[u8], at: &mut usize) -> Value {
        match b[*at] {
            b'{' => {
                *at += 1;
                let mut map = Map::new();
                while b[*at] != b'}' {
                    if !map.is_empty() {
                        assert_eq!(b[*at], b',');
                        *at += 1;
                    }
                    let Value::String(key) = read_value(b, at) else {
                        panic!("a key cut or not a string at {at}");
                    };
                    assert_eq!(b[*at], b':');
                    *at += 1;
                    let value = read_value(b, at);
                    assert!(map.insert(key, value).is_none(), "a key twice");
                }
                *at += 1;
                Value::Object(map)
            }
            b'[' => {
                *at += 1;
                let mut items = vec![];
                while b[*at] != b']' {
                    if !items.is_empty() {
                        assert_eq!(b[*at], b',');
                        *at += 1;
                    }
                    items.push(read_value(b, at));
                }
                *at += 1;
                Value::Array(items)
            }
            b'"' => {
                let text = std::str::from_utf8(b).unwrap();
                let mut out = String::new();
                *at += 1;
                loop {
                    match b[*at] {
                        b'"' => break,
                        b'\\' => {
                            let (c, len) = match b[*at + 1] {
                                b'u' if b[*at + 2] == b'{' => {
                                    let end = text[*at..].find('}').unwrap() + *at;
                                    let hex = &text[*at + 3..end];
                                    let c = char::from_u32(u32::from_str_radix(hex, 16).unwrap());
                                    (c.unwrap(), end + 1 - *at)
                                }
                                b'u' => {
                                    let hex = &text[*at + 2..*at + 6];
                                    let c = char::from_u32(u32::from_str_radix(hex, 16).unwrap());
                                    (c.unwrap(), 6)
                                }
                                e => {
                                    let c = match e {
                                        b'n' => '\n',
                                        b'r' => '\r',
                                        b't' => '\t',
                                        b'b' => '\u{8}',
                                        b'f' => '\u{c}',
                                        other => other as char,
                                    };
                                    (c, 2)
                                }
                            };
                            out.push(c);
                            *at += len;
                        }
                        c => {
                            assert!(c == b' ' || c.is_ascii_graphic(), "{c} raw");
                            out.push(c as char);
                            *at += 1;
                        }
                    }
                }
                *at += 1;
                if let Some(rest) = text[*at..].strip_prefix("...(") {
                    let digits = rest.split(' ').next().unwrap();
                    let tail = format!("...({digits} more bytes)");
                    assert!(text[*at..].starts_with(&tail));
                    *at += tail.len();
                    return json!({"$cut": out, "$left": digits.parse::<usize>().unwrap()});
                }
                Value::String(out)
            }
            _ => {
                let end = b[*at..].iter().position(|c| b",]}".contains(c)).unwrap() + *at;
                let value = serde_json::from_slice(&b[*at..end]).unwrap();
                *at = end;
                value
            }
        }
    }

    /// Whether `back` is `sent` but for strings cut (each its true start and the bytes left).
    fn same(sent: &Value, back: &Value) -> bool {
        match (sent, back) {
            (Value::String(s), Value::Object(cut)) if cut.contains_key("$cut") => {
                let start = cut["$cut"].as_str().unwrap();
                s.starts_with(start)
                    && cut["$left"] == s.len() - start.len()
                    && start.len() < s.len()
            }
            (Value::Object(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
            }
            (Value::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
            }
            (a, b) => a == b,
        }
    }

    /// A number below `n`, from `seed` (xorshift).
    fn next(seed: &mut u64, n: u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed % n
    }

    /// A key or string of the characters that could confuse a reader (quotes, backslashes,
    /// braces, the mark's own text, controls, bidi, astral), short or long.
    fn text(seed: &mut u64, long: bool) -> String {
        const CHARS: [&str; 16] = [
            "a",
            "b",
            "\"",
            "\\",
            "{",
            "}",
            ":",
            ",",
            "...(",
            " more bytes)",
            "\n",
            "\u{1}",
            "\u{7f}",
            "\u{202e}",
            "é",
            "\u{1f600}",
        ];
        let len = if long {
            100 + next(seed, 3000)
        } else {
            next(seed, 10)
        };
        (0..len).map(|_| CHARS[next(seed, 16) as usize]).collect()
    }

    /// Arguments of every shape, from a fixed seed.
    fn arbitrary(seed: &mut u64, depth: u32) -> Value {
        let kind = if depth == 0 { 0 } else { next(seed, 8) };
        match kind {
            0 => {
                let mut map = Map::new();
                for _ in 0..next(seed, 5) {
                    let long = next(seed, 10) == 0;
                    let key = text(seed, long);
                    map.insert(key, arbitrary(seed, depth + 1));
                }
                Value::Object(map)
            }
            1 if depth < 5 => {
                let n = next(seed, 4);
                Value::Array((0..n).map(|_| arbitrary(seed, depth + 1)).collect())
            }
            1 | 2 => json!(next(seed, 2_000_000) as i64 - 1_000_000),
            3 => json!(next(seed, 1000) as f64 / 7.0),
            4 => json!(next(seed, 2) == 0),
            5 => Value::Null,
            _ => {
                let long = next(seed, 3) == 0;
                Value::String(text(seed, long))
            }
        }
    }

    #[test]
    fn every_key_and_value_reads_back_from_any_preview() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let (mut kinds, mut tried) = (std::collections::BTreeMap::new(), 0);
        for _ in 0..400 {
            let args = arbitrary(&mut seed, 0);
            for bound in [64, 300, 2000, 20000] {
                tried += 1;
                let p = shown(args.clone(), bound);
                *kinds.entry(format!("{:?}", p.shown)).or_insert(0) += 1;
                assert!(
                    p.text.bytes().all(|c| c == b' ' || c.is_ascii_graphic()),
                    "{}",
                    p.text
                );
                if p.shown == Shown::TooLarge {
                    assert!(p.text.starts_with("(not shown: "));
                    continue;
                }
                assert!(p.text.len() <= bound, "{} > {bound}", p.text.len());
                let back = read_back(&p.text);
                assert!(same(&args, &back), "{args}\n{}", p.text);
                assert_eq!(p.shown == Shown::Whole, back == args, "{}", p.text);
            }
        }
        // Every outcome was tried, many times.
        assert!(kinds.values().all(|&n| n > tried / 20), "{kinds:?}");
        assert_eq!(kinds.len(), 3, "{kinds:?}");
    }
}
