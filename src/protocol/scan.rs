//! One pass over JSON text that builds nothing: how deep it nests, and whether it holds
//! an integer outside 64 bits.
//!
//! Beside the parsers, for what they cannot say. serde_json skips a value it is told to
//! ignore without its recursion limit, so the door's check of a JSON route's body would
//! pass a body nested 100,000 deep on to the backend; and it reads an integer beyond
//! `u64`/`i64` as the nearest `f64`, so two different such integers would read as one
//! value, and share a cache key or a batch. The scan is a lexer's walk (strings skipped
//! with their escapes), linear in the text, and never fails: text that is not JSON is
//! the parser's to refuse.

/// What [`scan`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scan {
    /// The deepest nesting of arrays and objects (0 for a scalar).
    pub depth: usize,
    /// Whether an integer literal is outside `i64::MIN..=u64::MAX`.
    pub wide_integer: bool,
}

/// The deepest nesting a JSON body may have: serde_json's own limit when it builds values.
pub const MAX_DEPTH: usize = 128;

/// Looks at `json` once (see the module's docs).
pub fn scan(json: &[u8]) -> Scan {
    let (mut seen, mut depth, mut i) = (Scan::default(), 0usize, 0usize);
    while let Some(&b) = json.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = json.get(i) {
                    match c {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'[' | b'{' => {
                depth += 1;
                seen.depth = seen.depth.max(depth);
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let negative = b == b'-';
                let digits_from = i + usize::from(negative);
                let mut end = digits_from;
                while json.get(end).is_some_and(u8::is_ascii_digit) {
                    end += 1;
                }
                let integer = !matches!(json.get(end), Some(b'.' | b'e' | b'E'));
                if integer && wide(&json[digits_from..end], negative) {
                    seen.wide_integer = true;
                }
                i = end.max(i + 1);
                while matches!(json.get(i), Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')) {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    seen
}

/// Whether the integer with these decimal `digits` (and sign) is outside 64 bits.
fn wide(digits: &[u8], negative: bool) -> bool {
    let first = digits.iter().position(|d| *d != b'0').unwrap_or(digits.len());
    let digits = &digits[first..];
    // Same length: decimal strings compare as the numbers do.
    let limit: &[u8] = match negative {
        true => b"9223372036854775808",
        false => b"18446744073709551615",
    };
    digits.len() > limit.len() || digits.len() == limit.len() && digits > limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_arrays_and_objects_but_not_strings() {
        assert_eq!(scan(b"1").depth, 0);
        assert_eq!(scan(br#"{"a":[1,{"b":[]}]}"#).depth, 4);
        assert_eq!(
            scan(br#"{"a":"[[[[{{{\"]]]"}"#).depth,
            1,
            "brackets in strings, escaped quotes"
        );
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(scan(deep.as_bytes()).depth, 100_000);
    }

    #[test]
    fn integers_beyond_64_bits_are_seen_and_others_not() {
        for narrow in [
            "18446744073709551615",
            "-9223372036854775808",
            "00018446744073709551615",
            "1e400",
            "18446744073709551616.5",
            "-1.8446744073709551616e30",
            r#""18446744073709551616""#,
            "[0,-0,123]",
        ] {
            assert!(!scan(narrow.as_bytes()).wide_integer, "{narrow}");
        }
        for wide in [
            "18446744073709551616",
            "-9223372036854775809",
            r#"{"x":[1,99999999999999999999999]}"#,
        ] {
            assert!(scan(wide.as_bytes()).wide_integer, "{wide}");
        }
    }

    #[test]
    fn any_bytes_scan_without_panicking() {
        for text in [&b"\"\\"[..], b"-", b"--1", b"[\"", b"\xff\xfe", b"}}}]]"] {
            let _ = scan(text);
        }
    }
}
