//! The `grpc-timeout` header: at most eight digits and a unit letter.

use std::time::Duration;

const MAX_DIGITS: u64 = 99_999_999;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid grpc-timeout '{0}': expected 1 to 8 digits followed by one of H M S m u n")]
pub struct TimeoutError(pub String);

/// Encodes a deadline with the finest unit whose value fits in eight digits,
/// rounding up so that the server never sees a shorter deadline than ours.
pub fn encode_timeout(timeout: Duration) -> String {
    // Every call sends one: u64 arithmetic (no 128-bit division) when the
    // nanoseconds fit, which is any deadline under 584 years.
    let nanos = timeout.as_nanos();
    const UNITS: [(u64, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per_unit, unit) in UNITS {
        let value = match u64::try_from(nanos) {
            Ok(nanos) => nanos.div_ceil(per_unit),
            Err(_) => u64::try_from(nanos.div_ceil(u128::from(per_unit))).unwrap_or(u64::MAX),
        };
        if value <= MAX_DIGITS {
            let mut digits = itoa::Buffer::new();
            let mut out = String::with_capacity(9);
            out.push_str(digits.format(value));
            out.push(unit);
            return out;
        }
    }
    format!("{MAX_DIGITS}H")
}

/// Parses a `grpc-timeout` value.
pub fn parse_timeout(value: &str) -> Result<Duration, TimeoutError> {
    let err = || TimeoutError(value.to_string());
    let unit = value.chars().last().ok_or_else(err)?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let duration = match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return Err(err()),
    };
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn picks_the_finest_unit_that_fits() {
        assert_eq!(encode_timeout(Duration::from_millis(1500)), "1500000u");
        assert_eq!(
            encode_timeout(Duration::from_nanos(99_999_999)),
            "99999999n"
        );
        assert_eq!(encode_timeout(Duration::from_secs(1)), "1000000u");
        assert_eq!(encode_timeout(Duration::from_secs(100_000)), "100000S");
        assert_eq!(
            encode_timeout(Duration::from_secs(1_000_000_000)),
            "16666667M"
        );
        assert_eq!(encode_timeout(Duration::from_secs(u64::MAX)), "99999999H");
        assert_eq!(encode_timeout(Duration::ZERO), "0n");
    }

    #[test]
    fn parses_every_unit_and_rejects_garbage() {
        assert_eq!(parse_timeout("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_timeout("10S"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("250m"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_timeout("7u"), Ok(Duration::from_micros(7)));
        assert_eq!(
            parse_timeout("99999999n"),
            Ok(Duration::from_nanos(99_999_999))
        );
        for bad in [
            "",
            "S",
            "100",
            "123456789S",
            "1s",
            "-1S",
            "1.5S",
            "1 S",
            "1é",
        ] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(
            parse_timeout("5x").unwrap_err().to_string(),
            "invalid grpc-timeout '5x': expected 1 to 8 digits followed by one of H M S m u n"
        );
    }

    proptest! {
        #[test]
        fn encoding_never_shortens_and_stays_close(nanos in 0u64..=u64::MAX / 2) {
            let d = Duration::from_nanos(nanos);
            let text = encode_timeout(d);
            prop_assert!(text.len() <= 9);
            let back = parse_timeout(&text).unwrap();
            prop_assert!(back >= d);
            // A coarser unit is chosen only when the finer one overflowed, so
            // the value has at least six digits: rounding adds < 10 ppm.
            prop_assert!(back - d <= d / 100_000 + Duration::from_nanos(1));
        }

        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,12}") {
            let _ = parse_timeout(&s);
        }
    }
}
