//! Durations written as a whole number and a unit (`30s`, `7D`, `250ms`), as queue and
//! stream arguments take them; each caller names its own units.

/// A duration that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not a whole number followed by one of the units.
    Syntax,
    /// More milliseconds than fit in a `u64`.
    Overflow,
}

/// Parses `text` as digits followed by exactly one of `units` (name, milliseconds per unit)
/// into milliseconds.
pub(crate) fn parse_ms(text: &str, units: &[(&str, u64)]) -> Result<u64, DurationError> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let unit_ms = units.iter().find(|(name, _)| *name == unit).map(|(_, ms)| *ms).ok_or(DurationError::Syntax)?;
    let n: u64 =
        number.parse().map_err(|_| if digits > 0 { DurationError::Overflow } else { DurationError::Syntax })?;
    n.checked_mul(unit_ms).ok_or(DurationError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_and_unit() {
        let units = [("ms", 1), ("s", 1000)];
        assert_eq!(parse_ms("250ms", &units), Ok(250));
        assert_eq!(parse_ms("3s", &units), Ok(3000));
        assert_eq!(parse_ms("0s", &units), Ok(0));
        for bad in ["", "s", "3", "3m", "3 s", "-3s", "1.5s"] {
            assert_eq!(parse_ms(bad, &units), Err(DurationError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_ms("99999999999999999999s", &units), Err(DurationError::Overflow));
        assert_eq!(parse_ms("18446744073709551615s", &units), Err(DurationError::Overflow));
    }
}
