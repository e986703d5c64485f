//! Event payload JSON (E2, E3) and the scalar text used for matching (Q3).
//!
//! The crate is built with serde_json's `arbitrary_precision`, so a number keeps the exact
//! text the client sent (`9007199254740993` does not become a float), and `preserve_order`,
//! so an object keeps the client's key order.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::Error;
use crate::limits::MAX_NUMBER_EXPANSION;

/// The canonical key holding an event's type inside its stored data (E3).
pub const EVENT_TYPE_KEY: &str = "eventType";

/// A parsed JSON object payload.
type Object = Map<String, Value>;

/// Parses `data`/`metadata` text (E2): empty or `null` means `{}`; anything else must be a
/// JSON object. `what` names the field for the error message (e.g. "event 3 data").
fn parse_object(text: &str, what: &dyn Fn() -> String) -> Result<Object, Error> {
    let trimmed = trim_payload(text);
    if trimmed.is_empty() {
        return Ok(Object::new());
    }
    let value: Value = serde_json::from_str(trimmed)
        .map_err(|e| Error::invalid(format!("{} is not valid JSON: {e}", what())))?;
    match value {
        Value::Null => Ok(Object::new()),
        Value::Object(map) => Ok(map),
        other => Err(Error::invalid(format!(
            "{} must be a JSON object, got {}",
            what(),
            kind(&other)
        ))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Compact JSON text of an object.
fn to_text(obj: &Object) -> String {
    // Serialising a Map<String, Value> cannot fail: keys are strings, no custom Serialize.
    serde_json::to_string(obj).unwrap_or_else(|_| "{}".to_string())
}

/// The scalar text of a value for matching (Q3), or `None` for null, objects and arrays.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(if *b { "true" } else { "false" }.to_string()),
        Value::Number(n) => Some(number_text(&n.to_string())),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Adds `eventType` to an event's top-level scalars (which must not hold it) and sorts them
/// by key: the event's tags (E3, X2).
pub fn tag_set(mut scalars: Vec<(String, String)>, event_type: &str) -> Vec<(String, String)> {
    scalars.push((EVENT_TYPE_KEY.to_string(), event_type.to_string()));
    // Object keys are unique, so the order is total.
    scalars.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    scalars
}

/// Every top-level scalar of an object, in the object's order. Taking the object by value
/// moves string values into their tags instead of copying payload text once more.
fn object_scalars(data: Object) -> Vec<(String, String)> {
    data.into_iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k, s)),
            other => scalar_text(&other).map(|t| (k, t)),
        })
        .collect()
}

/// Which payload field a text is: an event's data loses its `eventType` key (E3), its
/// metadata is kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// `data`: tags come from its scalars.
    Data,
    /// `metadata`: stored, never matched.
    Metadata,
}

/// A payload as stored: compact object text and its top-level scalars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// Compact JSON object text (without `eventType` for [`Payload::Data`]).
    pub text: String,
    /// `(key, scalar text)` of every top-level scalar (Q3), in the object's order; empty
    /// for [`Payload::Metadata`].
    pub scalars: Vec<(String, String)>,
}

/// Validates `data`/`metadata` text and brings it into stored form (E2, E3). `what` names
/// the field for error messages (e.g. "event 3 data").
///
/// Typical payloads — a flat object of plain strings, numbers and booleans — take a single
/// pass over the text that borrows every key and value; anything else (nesting, escapes,
/// exponents, duplicate keys, errors) goes through a full `serde_json::Value` tree. Both give
/// byte-identical results (a property test compares them), so the stored text never
/// depends on which path ran.
pub fn canonicalize(
    text: &str,
    payload: Payload,
    what: &dyn Fn() -> String,
) -> Result<Canonical, Error> {
    refuse_serde_json_marker(text, what)?;
    match flat_object(trim_payload(text), payload) {
        Some(fast) => Ok(fast),
        None => canonicalize_tree(text, payload, what),
    }
}

/// The prefix of the keys serde_json represents its private types by
/// (`$serde_json::private::Number` with `arbitrary_precision`,
/// `$serde_json::private::RawValue` with `raw_value`): its tree parser reads any object
/// whose first key is one of them as that type (`{"a":{"<number key>":"12"}}` would be
/// stored as `{"a":12}`, a top-level one is "not valid JSON"). Found by the `json_canonical`
/// fuzz target. A payload with this text anywhere (in a key or a value, escaped or not) is
/// refused, so that what is stored is always what was sent.
pub const SERDE_JSON_MARKER: &str = "$serde_json::private::";

fn refuse_serde_json_marker(text: &str, what: &dyn Fn() -> String) -> Result<(), Error> {
    let refused = || {
        Error::invalid(format!(
            "{} holds the string {SERDE_JSON_MARKER:?}, which Cairn's JSON parser reserves",
            what()
        ))
    };
    if !text.contains('\\') {
        return if text.contains(SERDE_JSON_MARKER) {
            Err(refused())
        } else {
            Ok(())
        };
    }
    // Escapes can spell the marker: decode every string that has one.
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i;
        let mut escaped = false;
        i += 1;
        while i < bytes.len() && bytes[i] != b'"' {
            if bytes[i] == b'\\' {
                escaped = true;
                i += 1;
            }
            i += 1;
        }
        if i >= bytes.len() {
            // Unterminated: the parser refuses the payload anyway.
            return Ok(());
        }
        let token = &text[start..=i];
        let is_marker = if escaped {
            serde_json::from_str::<String>(token).is_ok_and(|s| s.contains(SERDE_JSON_MARKER))
        } else {
            token.contains(SERDE_JSON_MARKER)
        };
        if is_marker {
            return Err(refused());
        }
        i += 1;
    }
    Ok(())
}

fn trim_payload(text: &str) -> &str {
    text.trim_matches(|c: char| c.is_ascii_whitespace())
}

/// The general path of [`canonicalize`]. Public so that the fuzz target can hold the fast
/// path to it on any input.
pub fn canonicalize_tree(
    text: &str,
    payload: Payload,
    what: &dyn Fn() -> String,
) -> Result<Canonical, Error> {
    refuse_serde_json_marker(text, what)?;
    let mut object = parse_object(text, what)?;
    if payload == Payload::Data {
        object.shift_remove(EVENT_TYPE_KEY);
    }
    let text = to_text(&object);
    let scalars = match payload {
        Payload::Data => object_scalars(object),
        Payload::Metadata => Vec::new(),
    };
    Ok(Canonical { text, scalars })
}

/// A top-level object's entries as slices of the text. Keys with escapes fail to borrow,
/// which sends the text down the general path.
struct FlatEntries<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for FlatEntries<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = FlatEntries<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(entry) = map.next_entry::<&'de str, &'de RawValue>()? {
                    entries.push(entry);
                }
                Ok(FlatEntries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The fast path of [`canonicalize`]: `None` unless `text` is an object whose keys are
/// unique and free of escapes and whose values are strings without escapes, numbers
/// without exponents, booleans or null — the values whose compact text is their source
/// text.
fn flat_object(text: &str, payload: Payload) -> Option<Canonical> {
    if !text.starts_with('{') {
        return None;
    }
    let FlatEntries(entries) = serde_json::from_str(text).ok()?;
    let mut out = String::with_capacity(text.len());
    let mut scalars = Vec::with_capacity(match payload {
        Payload::Data => entries.len(),
        Payload::Metadata => 0,
    });
    let mut keys = Vec::with_capacity(entries.len());
    out.push('{');
    for (key, raw) in entries {
        let raw = raw.get();
        let scalar = match raw.as_bytes().first()? {
            b'"' => {
                let inner = raw.get(1..raw.len() - 1)?;
                if inner.contains('\\') {
                    return None;
                }
                Some(inner.to_string())
            }
            b'-' | b'0'..=b'9' => {
                // serde_json respells exponents (`1E5` is stored as `1e+5`).
                if raw.bytes().any(|b| b == b'e' || b == b'E') {
                    return None;
                }
                Some(number_text(raw))
            }
            b't' | b'f' => Some(raw.to_string()),
            b'n' => None,
            _ => return None,
        };
        // Checked only now: the general path rejects a bad value even under a key it drops
        // (serde_json's raw values let lone surrogates such as `"\\ud800"` through).
        if payload == Payload::Data && key == EVENT_TYPE_KEY {
            continue;
        }
        if !keys.is_empty() {
            out.push(',');
        }
        out.push('"');
        out.push_str(key);
        out.push_str("\":");
        out.push_str(raw);
        keys.push(key);
        if let (Payload::Data, Some(value)) = (payload, scalar) {
            scalars.push((key.to_string(), value));
        }
    }
    out.push('}');
    // A repeated key keeps its first place and its last value in the general path; such
    // objects are rare enough to leave to it.
    keys.sort_unstable();
    if keys.windows(2).any(|pair| pair[0] == pair[1]) {
        return None;
    }
    Some(Canonical { text: out, scalars })
}

/// Decimal text of a JSON number literal, as PostgreSQL's `numeric` prints it (Orisun's
/// reference backend): the exponent is expanded (`1e10` → `10000000000`, `1.5e-3` →
/// `0.0015`), the written scale is kept (`1.50` stays `1.50`, `1.50e1` → `15.0`), negative
/// zero loses its sign. Literals that are not JSON numbers, or whose expansion would be
/// absurdly long, are returned unchanged.
pub fn number_text(literal: &str) -> String {
    expand_number(literal).unwrap_or_else(|| literal.to_string())
}

fn expand_number(lit: &str) -> Option<String> {
    let (negative, rest) = match lit.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, lit),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac_part.bytes().all(|b| b.is_ascii_digit())
        || (mantissa.contains('.') && frac_part.is_empty())
    {
        return None;
    }
    if exponent == 0
        && !lit.contains(['e', 'E'])
        && !int_part.starts_with("00")
        && !negative_zero(negative, int_part, frac_part)
    {
        // Already plain decimal: the common case, no allocation games.
        return Some(strip_leading_zeros(negative, int_part, frac_part));
    }
    // The exponent is the client's (any i64): i128 holds the scale and the expansion's
    // length for every such exponent, so nothing wraps past the guard (with overflow checks
    // off, `1e+9223372036854775807` once wrapped to a small length and asked for
    // `"0".repeat(i64::MAX)`).
    let digit_count = int_part.len() + frac_part.len();
    let scale = i128::try_from(frac_part.len()).ok()? - i128::from(exponent);
    let expanded_len = i128::try_from(digit_count).ok()? + scale.abs();
    if expanded_len > MAX_NUMBER_EXPANSION as i128 {
        return None;
    }
    // Within the guard, |scale| ≤ MAX_NUMBER_EXPANSION.
    let scale = isize::try_from(scale).ok()?;
    let digits: String = format!("{int_part}{frac_part}");
    let (int_digits, frac_digits) = if scale <= 0 {
        (
            format!("{digits}{}", "0".repeat(scale.unsigned_abs())),
            String::new(),
        )
    } else {
        let scale = scale.unsigned_abs();
        let padded = if digits.len() <= scale {
            format!("{}{digits}", "0".repeat(scale - digits.len() + 1))
        } else {
            digits
        };
        let split = padded.len() - scale;
        (padded[..split].to_string(), padded[split..].to_string())
    };
    Some(strip_leading_zeros(negative, &int_digits, &frac_digits))
}

fn negative_zero(negative: bool, int_part: &str, frac_part: &str) -> bool {
    negative && int_part.bytes().chain(frac_part.bytes()).all(|b| b == b'0')
}

fn strip_leading_zeros(negative: bool, int_part: &str, frac_part: &str) -> String {
    let int_trimmed = int_part.trim_start_matches('0');
    let int_trimmed = if int_trimmed.is_empty() {
        "0"
    } else {
        int_trimmed
    };
    let zero = int_trimmed == "0" && frac_part.bytes().all(|b| b == b'0');
    let sign = if negative && !zero { "-" } else { "" };
    if frac_part.is_empty() {
        format!("{sign}{int_trimmed}")
    } else {
        format!("{sign}{int_trimmed}.{frac_part}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn serde_json_markers_are_refused_however_they_are_spelled() {
        let what = || "event 0 data".to_string();
        for text in [
            r#"{"$serde_json::private::Number":"","k":""}"#,
            r#"{"a":{"$serde_json::private::Number":"12"}}"#,
            r#"{"a":"$serde_json::private::Number"}"#,
            "{\"$serde_json::private::RawValue\":\t\t-5}",
            r#"{"":"\u0581 $serde_json::private::Numbers"}"#,
            r#"{"\u0024serde_json::private::Number":"12","b":"\n"}"#,
            r#"{"x":"\"","a":{"$serde_json::private::Num\u0062er":"1"}}"#,
        ] {
            for payload in [Payload::Data, Payload::Metadata] {
                let err = canonicalize(text, payload, &what).expect_err(text);
                assert!(err.to_string().contains("reserves"), "{text}: {err}");
                assert!(canonicalize_tree(text, payload, &what).is_err(), "{text}");
            }
        }
        // Strings that merely resemble it are stored.
        for text in [
            r#"{"serde_json::private::Number":"12"}"#,
            r#"{"a":"\u0024serde_json","b":"private::Number"}"#,
        ] {
            canonicalize(text, Payload::Data, &what).expect(text);
        }
    }

    #[test]
    fn numbers_print_like_postgres_numeric() {
        let cases = [
            ("42", "42"),
            ("-42", "-42"),
            ("0", "0"),
            ("-0", "0"),
            ("-0.00", "0.00"),
            ("1.50", "1.50"),
            ("1e10", "10000000000"),
            ("1E10", "10000000000"),
            ("1e+2", "100"),
            ("1.5e-3", "0.0015"),
            ("1.50e1", "15.0"),
            ("12.345e1", "123.45"),
            ("5e-1", "0.5"),
            ("-2.5E-2", "-0.025"),
            ("9223372036854775807", "9223372036854775807"),
            ("9007199254740993", "9007199254740993"),
            (
                "0.12345678901234567890123456789",
                "0.12345678901234567890123456789",
            ),
            ("0e5", "0"),
        ];
        for (lit, want) in cases {
            assert_eq!(number_text(lit), want, "{lit}");
        }
        assert_eq!(number_text("1e999999"), "1e999999");
    }

    /// Exponents at the ends of i64 keep their literal (review C1: with overflow checks
    /// off they wrapped past the expansion guard and aborted the process).
    #[test]
    fn extreme_exponents_keep_their_literal() {
        for lit in [
            "1e+9223372036854775807",
            "1e9223372036854775807",
            "1e-9223372036854775808",
            "0.5e+9223372036854775807",
            "-0.5e+9223372036854775807",
            "5e-9223372036854775807",
            "123.456e-9223372036854775808",
            "1e+9223372036854775806",
            "00e9223372036854775807",
            "1e99999999999999999999",
            "1e-99999999999999999999",
        ] {
            assert_eq!(number_text(lit), lit, "{lit}");
        }
        // At the guard: exactly MAX_NUMBER_EXPANSION characters expand, one more does not.
        let at_limit = format!("1e{}", MAX_NUMBER_EXPANSION - 1);
        assert_eq!(number_text(&at_limit).len(), MAX_NUMBER_EXPANSION);
        let past = format!("1e{MAX_NUMBER_EXPANSION}");
        assert_eq!(number_text(&past), past);
        let small = format!("1e-{}", MAX_NUMBER_EXPANSION - 1);
        assert_eq!(number_text(&small).len(), MAX_NUMBER_EXPANSION + 1);
        assert_eq!(
            number_text(&small),
            format!("0.{}1", "0".repeat(MAX_NUMBER_EXPANSION - 2))
        );
    }

    #[test]
    fn extreme_exponents_in_payloads_are_stored_and_indexed_by_their_literal() {
        let what = || "d".to_string();
        let data = canonicalize(
            r#"{"a":1e+9223372036854775807,"b":1e-9223372036854775808,"c":0.5e+9223372036854775807}"#,
            Payload::Data,
            &what,
        )
        .expect("valid JSON numbers");
        let s: BTreeMap<_, _> = data.scalars.into_iter().collect();
        assert_eq!(s["a"], "1e+9223372036854775807");
        assert_eq!(s["b"], "1e-9223372036854775808");
        assert_eq!(s["c"], "0.5e+9223372036854775807");
    }

    #[test]
    fn payload_parsing() {
        let what = || "event 0 data".to_string();
        assert!(parse_object("", &what).expect("empty").is_empty());
        assert!(parse_object("null", &what).expect("null").is_empty());
        assert!(parse_object(" {} ", &what).expect("ws").is_empty());
        let err = parse_object("[1]", &what).expect_err("array");
        assert_eq!(
            err.to_string(),
            "event 0 data must be a JSON object, got an array"
        );
        assert!(parse_object("{", &what).is_err());
        assert!(parse_object("\"x\"", &what).is_err());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse_object(&format!("{{\"a\":{deep}}}"), &what).is_err());
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let what = || "d".to_string();
        let text = r#"{"big":9223372036854775807,"f":9007199254740993,"p":0.12345678901234567890123456789}"#;
        let obj = parse_object(text, &what).expect("valid");
        assert_eq!(to_text(&obj), text);
        // serde_json spells an exponent with its sign; the value (and its tag) is unchanged.
        let data = canonicalize(
            r#"{"big":9223372036854775807,"e":1e10}"#,
            Payload::Data,
            &what,
        )
        .expect("valid");
        let s: BTreeMap<_, _> = tag_set(data.scalars, "T").into_iter().collect();
        assert_eq!(s["big"], "9223372036854775807");
        assert_eq!(s["e"], "10000000000");
        assert_eq!(s[EVENT_TYPE_KEY], "T");
    }

    #[test]
    fn scalar_matching_rules() {
        let data = canonicalize(
            r#"{"s":"42","n":42,"b":true,"z":null,"o":{"a":1},"a":[1],"eventType":"Spoof"}"#,
            Payload::Data,
            &|| "d".to_string(),
        )
        .expect("valid");
        let s: BTreeMap<_, _> = tag_set(data.scalars, "Real").into_iter().collect();
        assert_eq!(s["s"], "42");
        assert_eq!(s["n"], "42");
        assert_eq!(s["b"], "true");
        assert!(!s.contains_key("z") && !s.contains_key("o") && !s.contains_key("a"));
        assert_eq!(s[EVENT_TYPE_KEY], "Real");
    }

    #[test]
    fn flat_payloads_take_the_single_pass() {
        let bench =
            r#"{"benchmark_context":"seed-7","event_index":3,"sequence":12,"payload":"xxxx"}"#;
        let fast = flat_object(bench, Payload::Data).expect("flat object");
        assert_eq!(fast.text, bench);
        assert_eq!(fast.scalars.len(), 4);
        let with_type = r#"{ "n" : -1.50 , "eventType":"Spoof", "ok":true, "z":null }"#;
        let fast = flat_object(with_type, Payload::Data).expect("flat object");
        assert_eq!(fast.text, r#"{"n":-1.50,"ok":true,"z":null}"#);
        assert_eq!(
            fast.scalars,
            vec![("n".into(), "-1.50".into()), ("ok".into(), "true".into())]
        );
        let kept = flat_object(with_type, Payload::Metadata).expect("flat object");
        assert!(kept.text.contains("Spoof") && kept.scalars.is_empty());
        for general in [
            r#"{"a":{"b":1}}"#,
            r#"{"a":[1]}"#,
            r#"{"a":"line\nbreak"}"#,
            r#"{"k\u0041":1}"#,
            r#"{"a":1e5}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"eventType":"\ud800"}"#,
            "null",
            "",
            "{",
        ] {
            assert_eq!(flat_object(general, Payload::Data), None, "{general}");
        }
    }

    fn json_string() -> impl Strategy<Value = String> {
        let odd = prop::sample::select(vec![
            "\\n",
            "\\u00e9",
            "\\ud800",
            "\\ud83d\\ude00",
            "\\\"",
            "\\/",
            "\\\\",
            "\u{1}",
            "\\x",
            "\t",
            "\u{7f}",
        ]);
        let part = prop_oneof![4 => "[a-zé 0-9]{0,6}", 1 => odd.prop_map(String::from)];
        prop::collection::vec(part, 0..3).prop_map(|parts| format!("\"{}\"", parts.concat()))
    }

    fn json_number() -> impl Strategy<Value = String> {
        let odd = (
            prop::sample::select(vec!["", "-", "+"]),
            prop::sample::select(vec!["0", "7", "01", "9007199254740993", ""]),
            prop::sample::select(vec!["", ".5", ".50", ".", ".000"]),
            prop::sample::select(vec!["", "e5", "E5", "e+2", "e-3", "E-0", "e", "e99999999"]),
        )
            .prop_map(|(sign, int, frac, exp)| format!("{sign}{int}{frac}{exp}"));
        prop_oneof![3 => "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,4})?", 1 => odd]
    }

    fn json_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            3 => json_string(),
            3 => json_number(),
            2 => prop::sample::select(vec!["true", "false", "null", "tru", "nul"]).prop_map(String::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                6 => inner.clone(),
                1 => prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
                1 => prop::collection::vec((json_key(), inner), 0..3).prop_map(|v| {
                    let entries: Vec<String> = v.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        })
    }

    fn json_key() -> impl Strategy<Value = String> {
        let plain = prop::sample::select(vec!["a", "b", "c", "d", "eventType", "kA", "é", ""]);
        let odd = prop::sample::select(vec!["k\\u0041", "a\u{1}", "\\\"q", "a\\n"]);
        prop_oneof![5 => plain, 1 => odd].prop_map(|k| format!("\"{k}\""))
    }

    fn space() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            8 => Just(""),
            1 => prop::sample::select(vec![" ", "\n", "\t", "\r\n ", "\u{c}"]),
        ]
    }

    /// Objects of keys and values with whitespace anywhere, plus non-objects and cut-off
    /// text.
    fn payload_text() -> impl Strategy<Value = String> {
        let object = prop::collection::vec(
            (space(), json_key(), space(), space(), json_value(), space()),
            0..6,
        )
        .prop_map(|entries| {
            let body: Vec<String> = entries
                .into_iter()
                .map(|(a, k, b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
                .collect();
            format!("{{{}}}", body.join(","))
        });
        let cut = prop_oneof![3 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)];
        (
            space(),
            prop_oneof![6 => object, 1 => json_value()],
            space(),
            cut,
        )
            .prop_map(|(lead, body, trail, cut)| {
                let text = format!("{lead}{body}{trail}");
                let Some(cut) = cut else { return text };
                let mut at = cut.index(text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text[..at].to_string()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16384))]

        /// The single pass never changes what is stored or what error a client sees.
        #[test]
        fn the_single_pass_agrees_with_the_value_tree(text in payload_text()) {
            for payload in [Payload::Data, Payload::Metadata] {
                let what = || "event 0 data".to_string();
                let fast = canonicalize(&text, payload, &what).map_err(|e| e.to_string());
                let tree = canonicalize_tree(&text, payload, &what).map_err(|e| e.to_string());
                prop_assert_eq!(fast, tree, "{:?} {:?}", payload, text);
            }
        }
    }
}
