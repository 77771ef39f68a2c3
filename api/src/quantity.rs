//! Exact parsing of Kubernetes quantities (`resource.Quantity`) into whole numbers.
//!
//! GPU resources are counts, MiB or percentages, so only whole values make
//! sense: `2`, `2000m`, `1k` and `1e3` are accepted, `1.5` and `500m` are not.

/// Why a quantity is not an acceptable whole number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantityError {
    /// Not a Kubernetes quantity at all.
    Malformed,
    /// Below zero.
    Negative,
    /// Has a fractional part.
    Fractional,
    /// Too large to represent.
    Overflow,
}

/// A quantity of bytes (`8Gi`, `8192Mi`) as whole MiB; an error naming the
/// rule otherwise (malformed, negative, fractional, or not whole MiB).
pub fn bytes_as_mib(text: &str) -> Result<u64, String> {
    let bytes = parse_whole(text)
        .map_err(|e| format!("{text:?} is not a whole quantity of bytes ({e:?})"))?;
    if bytes % (1 << 20) != 0 {
        return Err(format!("{text:?} is not a whole number of MiB"));
    }
    Ok(bytes >> 20)
}

/// A quantity (`30`, `3e1`) as a whole number; an error naming the rule otherwise.
pub fn whole(text: &str) -> Result<u64, String> {
    parse_whole(text).map_err(|e| format!("{text:?} is not a whole number ({e:?})"))
}

/// Parses a quantity such as `3000`, `4k`, `2Gi`, `1e3` or `2000m` into an integer.
pub fn parse_whole(text: &str) -> Result<u64, QuantityError> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(QuantityError::Malformed);
    }
    let (pow10, pow2) = suffix_exponents(suffix).ok_or(QuantityError::Malformed)?;

    // value = mantissa × 10^(pow10 - frac digits) × 2^pow2, computed exactly.
    let digits = format!("{int_part}{frac_part}");
    let mut mantissa: u128 = digits.parse().map_err(|_| QuantityError::Overflow)?;
    if mantissa == 0 {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative);
    }
    let mut exp10 = pow10 - i32::try_from(frac_part.len()).map_err(|_| QuantityError::Overflow)?;
    mantissa = mantissa
        .checked_mul(1u128.checked_shl(pow2).ok_or(QuantityError::Overflow)?)
        .ok_or(QuantityError::Overflow)?;
    while exp10 > 0 {
        mantissa = mantissa.checked_mul(10).ok_or(QuantityError::Overflow)?;
        exp10 -= 1;
    }
    while exp10 < 0 {
        if !mantissa.is_multiple_of(10) {
            return Err(QuantityError::Fractional);
        }
        mantissa /= 10;
        exp10 += 1;
    }
    u64::try_from(mantissa).map_err(|_| QuantityError::Overflow)
}

/// Decimal and binary exponents of a quantity suffix.
fn suffix_exponents(suffix: &str) -> Option<(i32, u32)> {
    Some(match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            let valid = !exp.is_empty()
                && exp
                    .trim_start_matches(['+', '-'])
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                && exp.len() <= 4;
            if !valid {
                return None;
            }
            (exp.parse().ok()?, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{QuantityError::*, bytes_as_mib, parse_whole, whole};

    #[test]
    fn bytes_become_whole_mib_or_an_error() {
        assert_eq!(bytes_as_mib("8Gi"), Ok(8192));
        assert_eq!(bytes_as_mib("81559Mi"), Ok(81559));
        assert!(
            bytes_as_mib("1000")
                .unwrap_err()
                .contains("whole number of MiB")
        );
        assert!(bytes_as_mib("-1Mi").is_err());
        assert_eq!(whole("30"), Ok(30));
        assert!(whole("0.5").is_err());
    }

    #[test]
    fn whole_quantities() {
        let cases = [
            ("0", 0),
            ("3000", 3000),
            ("+7", 7),
            ("2000m", 2),
            ("1k", 1000),
            ("4Ki", 4096),
            ("1Mi", 1 << 20),
            ("1e3", 1000),
            ("1E2", 100),
            ("1.5k", 1500),
            ("-0", 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_whole(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_whole_non_negative_number() {
        let cases = [
            ("", Malformed),
            ("abc", Malformed),
            ("1.2.3", Malformed),
            ("5 Mi", Malformed),
            ("5MiB", Malformed),
            ("1e", Malformed),
            ("1.5", Fractional),
            ("500m", Fractional),
            ("12e-1", Fractional),
            ("0.5", Fractional),
            ("-1", Negative),
            ("-1.5", Negative),
            ("99999999999999999999999", Overflow),
            ("20Ei", Overflow),
        ];
        for (text, want) in cases {
            assert_eq!(parse_whole(text), Err(want), "{text}");
        }
    }
}
