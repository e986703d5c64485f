//! Event payload JSON (E2, E3) and the scalar text used for matching (Q3).
//!
//! The crate is built with serde_json's `arbitrary_precision`, so a number keeps the exact
//! text the client sent (`9007199254740993` does not become a float), and `preserve_order`,
//! so an object keeps the client's key order.

use serde_json::{Map, Value};

use crate::Error;
use crate::limits::MAX_NUMBER_EXPANSION;

/// The canonical key holding an event's type inside its stored data (E3).
pub const EVENT_TYPE_KEY: &str = "eventType";

/// A parsed JSON object payload.
pub type Object = Map<String, Value>;

/// Parses `data`/`metadata` text (E2): empty or `null` means `{}`; anything else must be a
/// JSON object. `what` names the field for the error message (e.g. "event 3 data").
pub fn parse_object(text: &str, what: &dyn Fn() -> String) -> Result<Object, Error> {
    let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace());
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
pub fn to_text(obj: &Object) -> String {
    // Serialising a Map<String, Value> cannot fail: keys are strings, no custom Serialize.
    serde_json::to_string(obj).unwrap_or_else(|_| "{}".to_string())
}

/// The scalar text of a value for matching (Q3), or `None` for null, objects and arrays.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(if *b { "true" } else { "false" }.to_string()),
        Value::Number(n) => Some(number_text(&n.to_string())),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// The tag set of an event, consuming its data: every top-level scalar plus `eventType`
/// (E3, X2), sorted by key. Taking the object by value moves string values into their tags
/// instead of copying payload text once more.
pub fn into_scalars(data: Object, event_type: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = data
        .into_iter()
        .filter(|(k, _)| k != EVENT_TYPE_KEY)
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k, s)),
            other => scalar_text(&other).map(|t| (k, t)),
        })
        .collect();
    out.push((EVENT_TYPE_KEY.to_string(), event_type.to_string()));
    // Object keys are unique, so the order is total.
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    out
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
    let digits: String = format!("{int_part}{frac_part}");
    let scale = frac_part.len() as i64 - exponent;
    let expanded_len = digits.len() as i64 + scale.unsigned_abs() as i64;
    if expanded_len > MAX_NUMBER_EXPANSION as i64 {
        return None;
    }
    let (int_digits, frac_digits) = if scale <= 0 {
        (
            format!("{digits}{}", "0".repeat((-scale) as usize)),
            String::new(),
        )
    } else {
        let scale = scale as usize;
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

    use super::*;

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
        let obj = parse_object(r#"{"big":9223372036854775807,"e":1e10}"#, &what).expect("valid");
        let s: BTreeMap<_, _> = into_scalars(obj, "T").into_iter().collect();
        assert_eq!(s["big"], "9223372036854775807");
        assert_eq!(s["e"], "10000000000");
        assert_eq!(s[EVENT_TYPE_KEY], "T");
    }

    #[test]
    fn scalar_matching_rules() {
        let obj = parse_object(
            r#"{"s":"42","n":42,"b":true,"z":null,"o":{"a":1},"a":[1],"eventType":"Spoof"}"#,
            &|| "d".to_string(),
        )
        .expect("valid");
        let s: BTreeMap<_, _> = into_scalars(obj, "Real").into_iter().collect();
        assert_eq!(s["s"], "42");
        assert_eq!(s["n"], "42");
        assert_eq!(s["b"], "true");
        assert!(!s.contains_key("z") && !s.contains_key("o") && !s.contains_key("a"));
        assert_eq!(s[EVENT_TYPE_KEY], "Real");
    }
}
