//! Shared by both directions: the string forms of Timestamp, Duration and FieldMask in the proto3 JSON
//! mapping. Written here because their rules (RFC 3339 with 0/3/6/9
//! fractional digits, the ±10000-year duration bound, camelCase paths) are
//! the mapping's own; no date crate implements exactly these. And the type
//! an Any names, which both directions resolve.

use prost_reflect::MessageDescriptor;

const MIN_TIMESTAMP: i64 = -62_135_596_800; // 0001-01-01T00:00:00Z
const MAX_TIMESTAMP: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
const MAX_DURATION: i64 = 315_576_000_000;
const NANOS: i32 = 1_000_000_000;

/// Formats a Timestamp; `None` when it is outside years 1..=9999.
pub(crate) fn format_timestamp(seconds: i64, nanos: i32) -> Option<String> {
    let mut out = String::with_capacity(30);
    write_timestamp(seconds, nanos, &mut out).then_some(out)
}

fn timestamp_in_range(seconds: i64, nanos: i32) -> bool {
    (MIN_TIMESTAMP..=MAX_TIMESTAMP).contains(&seconds) && (0..NANOS).contains(&nanos)
}

fn duration_in_range(seconds: i64, nanos: i32) -> bool {
    // unsigned_abs: `abs` of i64::MIN / i32::MIN overflows (a peer sends them).
    seconds.unsigned_abs() <= MAX_DURATION.unsigned_abs()
        && nanos.unsigned_abs() < NANOS.unsigned_abs()
        && (seconds == 0 || nanos == 0 || (seconds < 0) == (nanos < 0))
}

/// The length of what [`write_timestamp`] writes, without writing it (a
/// printer that only counts); `None` where it writes nothing.
pub(crate) fn timestamp_len(seconds: i64, nanos: i32) -> Option<usize> {
    // Four-digit years: "YYYY-MM-DDThh:mm:ss", its fraction and "Z".
    timestamp_in_range(seconds, nanos).then(|| 20 + fraction_len(nanos.unsigned_abs()))
}

/// The length of what [`write_duration`] writes, without writing it.
pub(crate) fn duration_len(seconds: i64, nanos: i32) -> Option<usize> {
    let sign = usize::from(seconds < 0 || nanos < 0);
    let digits = seconds.unsigned_abs().checked_ilog10().unwrap_or(0) as usize + 1;
    duration_in_range(seconds, nanos)
        .then(|| sign + digits + fraction_len(nanos.unsigned_abs()) + 1)
}

/// Appends a Timestamp to `out`; false (and nothing written) when it is
/// outside years 1..=9999. Written digit by digit: a list of timestamps
/// spent most of its printing in `format!`.
pub(crate) fn write_timestamp(seconds: i64, nanos: i32, out: &mut String) -> bool {
    if !timestamp_in_range(seconds, nanos) {
        return false;
    }
    let days = seconds.div_euclid(86_400);
    let secs_of_day = seconds.rem_euclid(86_400) as usize;
    let (year, month, day) = civil_from_days(days);
    // In range, every part is non-negative and fits its width (years
    // 0001 to 9999): written two digits at a time into one buffer, as a
    // list of timestamps spends most of its time here.
    let year = year.unsigned_abs() as usize;
    let mut text = *b"0000-00-00T00:00:00";
    two_digits(&mut text[0..2], year / 100);
    two_digits(&mut text[2..4], year % 100);
    two_digits(&mut text[5..7], month as usize);
    two_digits(&mut text[8..10], day as usize);
    two_digits(&mut text[11..13], secs_of_day / 3600);
    two_digits(&mut text[14..16], secs_of_day / 60 % 60);
    two_digits(&mut text[17..19], secs_of_day % 60);
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
    fraction(nanos.unsigned_abs(), out);
    out.push('Z');
    true
}

/// "00" to "99".
const PAIRS: [[u8; 2]; 100] = {
    let mut pairs = [[b'0'; 2]; 100];
    let mut i = 0;
    while i < 100 {
        pairs[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    pairs
};

/// The last two decimal digits of `value` into `slot`.
fn two_digits(slot: &mut [u8], value: usize) {
    slot.copy_from_slice(&PAIRS[value % 100]);
}

/// `value` in `width` decimal digits, zero-padded (wider values keep all
/// their digits).
fn padded(out: &mut String, value: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let text = buf.format(value);
    for _ in text.len()..width {
        out.push('0');
    }
    out.push_str(text);
}

/// Parses an RFC 3339 timestamp (upper-case `T` and `Z`, or an offset).
pub(crate) fn parse_timestamp(text: &str) -> Option<(i64, i32)> {
    let b = text.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let year = digits(&b[0..4])?;
    let month = digits(&b[5..7])?;
    let day = digits(&b[8..10])?;
    let (hour, minute, second) = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    if year == 0 || !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let (nanos, rest) = parse_fraction(&b[19..])?;
    let offset = match rest {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if h > 23 || m > 59 {
                return None;
            }
            let offset = (h * 3600 + m * 60) as i64;
            if *sign == b'+' {
                offset
            } else {
                -offset
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year as i64, month, day);
    let seconds = days * 86_400 + (hour * 3600 + minute * 60 + second) as i64 - offset;
    (MIN_TIMESTAMP..=MAX_TIMESTAMP)
        .contains(&seconds)
        .then_some((seconds, nanos))
}

/// Formats a Duration as `[-]S[.fff]s`; `None` when out of range or the
/// signs of seconds and nanos disagree.
pub(crate) fn format_duration(seconds: i64, nanos: i32) -> Option<String> {
    let mut out = String::with_capacity(24);
    write_duration(seconds, nanos, &mut out).then_some(out)
}

/// Appends a Duration to `out`; false (and nothing written) when it has
/// no JSON form.
pub(crate) fn write_duration(seconds: i64, nanos: i32, out: &mut String) -> bool {
    if !duration_in_range(seconds, nanos) {
        return false;
    }
    if seconds < 0 || nanos < 0 {
        out.push('-');
    }
    padded(out, seconds.unsigned_abs(), 1);
    fraction(nanos.unsigned_abs(), out);
    out.push('s');
    true
}

/// Parses `[-]S[.f{1,9}]s`.
pub(crate) fn parse_duration(text: &str) -> Option<(i64, i32)> {
    let body = text.strip_suffix('s')?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, frac) = match body.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (body, None),
    };
    if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let seconds: i64 = whole.parse().ok()?;
    let nanos = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit()) => {
            f.parse::<i32>().ok()? * 10i32.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    if seconds > MAX_DURATION {
        return None;
    }
    Some(if negative {
        (-seconds, -nanos)
    } else {
        (seconds, nanos)
    })
}

/// `foo_bar.baz` → `fooBar.baz`; `None` when the path would not come back
/// the same way (upper case, or `_` not followed by a lower-case letter),
/// and for an empty path or one with a `,`: the JSON form joins paths with
/// commas and the parser skips empty ones, so those would come back as
/// other paths or none.
pub(crate) fn path_to_json(path: &str) -> Option<String> {
    if path.is_empty() || path.contains(',') {
        return None;
    }
    let mut out = String::with_capacity(path.len());
    let mut upper_next = false;
    for c in path.chars() {
        if c.is_ascii_uppercase() {
            return None;
        }
        if c == '_' {
            if upper_next {
                return None;
            }
            upper_next = true;
            continue;
        }
        if upper_next {
            if !c.is_ascii_lowercase() {
                return None;
            }
            out.push(c.to_ascii_uppercase());
            upper_next = false;
        } else {
            out.push(c);
        }
    }
    (!upper_next).then_some(out)
}

/// `fooBar.baz` → `foo_bar.baz`; `None` for a path with `_` (not a JSON path).
pub(crate) fn path_from_json(path: &str) -> Option<String> {
    let mut out = String::with_capacity(path.len() + 4);
    for c in path.chars() {
        if c == '_' {
            return None;
        }
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    Some(out)
}

fn fraction(nanos: u32, out: &mut String) {
    let (value, width) = fraction_digits(nanos);
    if width > 0 {
        out.push('.');
        padded(out, u64::from(value), width);
    }
}

/// The fraction's value and digits: 0, 3, 6 or 9 of them, the fewest
/// that hold `nanos`.
fn fraction_digits(nanos: u32) -> (u32, usize) {
    if nanos == 0 {
        (0, 0)
    } else if nanos % 1_000_000 == 0 {
        (nanos / 1_000_000, 3)
    } else if nanos % 1_000 == 0 {
        (nanos / 1_000, 6)
    } else {
        (nanos, 9)
    }
}

/// The length of what [`fraction`] writes: its digits and the dot.
fn fraction_len(nanos: u32) -> usize {
    match fraction_digits(nanos).1 {
        0 => 0,
        digits => digits + 1,
    }
}

/// Optional `.d{1,9}` at the start of `b`: the nanoseconds and the rest.
fn parse_fraction(b: &[u8]) -> Option<(i32, &[u8])> {
    let Some(rest) = b.strip_prefix(b".") else {
        return Some((0, b));
    };
    let n = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || n > 9 {
        return None;
    }
    let value = digits(&rest[..n])? as i32 * 10i32.pow(9 - n as u32);
    Some((value, &rest[n..]))
}

fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

fn is_leap(year: u32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (era arithmetic:
/// 400-year cycles of 146097 days, years starting in March).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date of a day counted from 1970-01-01, for days
/// of years 1 to 9999 (what a Timestamp in range has). Neri and Schneider's
/// "Euclidean affine functions" form (2022): a handful of 32-bit
/// multiplications and shifts, as long lists of timestamps print one date
/// per element. It counts in years that start on March 1st, from a day
/// moved forward by whole 400-year cycles so that every value is unsigned.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // 82 cycles of 146097 days put year 1 well above 0; 719468 is
    // 1970-01-01's day counted from 0000-03-01.
    const CYCLES: u32 = 82;
    const SHIFT: i64 = 719_468 + 146_097 * CYCLES as i64;
    let n = u32::try_from(days + SHIFT).unwrap_or(0);
    // Centuries and the day within one (the last of four is a day longer).
    let n1 = 4 * n + 3;
    let century = n1 / 146_097;
    let day_of_century = n1 % 146_097 / 4;
    // Years within the century: 2939745 / 2^32 is 4 / 1461 close enough
    // that the high half is the year and the low half its day.
    let n2 = u64::from(4 * day_of_century + 3) * 2_939_745;
    let year_of_century = (n2 >> 32) as u32;
    let day_of_year = (n2 as u32) / 2_939_745 / 4;
    // Months of 153 days per 5 (March to January), as 2141 / 2^16.
    let n3 = 2141 * day_of_year + 197_913;
    let (month, day) = (n3 >> 16, (n3 & 0xffff) / 2141 + 1);
    // January and February belong to the next calendar year.
    let january = day_of_year >= 306;
    let year =
        i64::from(100 * century + year_of_century) - 400 * i64::from(CYCLES) + i64::from(january);
    (year, if january { month - 12 } else { month }, day)
}

/// The message type an Any's type URL names: the part after the last '/'.
pub(crate) fn any_type(
    desc: &MessageDescriptor,
    type_url: &str,
) -> Result<MessageDescriptor, String> {
    let name = type_url.rsplit('/').next().unwrap_or_default();
    if !type_url.contains('/') || name.is_empty() {
        return Err(format!("invalid Any type URL '{type_url}'"));
    }
    desc.parent_pool()
        .get_message_by_name(name)
        .ok_or_else(|| format!("Any has unknown type '{type_url}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_what_is_written() {
        let seconds = [
            0,
            1,
            -1,
            9,
            10,
            59,
            86_399,
            1_709_210_096,
            MIN_TIMESTAMP,
            MAX_TIMESTAMP,
            MAX_TIMESTAMP + 1,
            MAX_DURATION,
            -MAX_DURATION,
            MAX_DURATION + 1,
            i64::MAX,
            i64::MIN,
        ];
        let nanos = [
            0,
            1,
            -1,
            500_000_000,
            1_000,
            999_999_999,
            -999_999_999,
            NANOS,
            i32::MIN,
        ];
        for s in seconds {
            for n in nanos {
                let (mut t, mut d) = (String::new(), String::new());
                let t = write_timestamp(s, n, &mut t).then_some(t.len());
                let d = write_duration(s, n, &mut d).then_some(d.len());
                assert_eq!(timestamp_len(s, n), t, "timestamp {s}s {n}ns");
                assert_eq!(duration_len(s, n), d, "duration {s}s {n}ns");
            }
        }
    }

    #[test]
    fn every_day_of_years_1_to_9999_has_its_date() {
        let (first, last) = (MIN_TIMESTAMP / 86_400, MAX_TIMESTAMP / 86_400);
        let mut previous = civil_from_days(first - 1);
        assert_eq!(previous, (0, 12, 31));
        for days in first..=last {
            let (year, month, day) = civil_from_days(days);
            assert!(
                (1..=12).contains(&month) && (1..=days_in_month(year as u32, month)).contains(&day)
            );
            assert_eq!(
                days_from_civil(year, month, day),
                days,
                "{year}-{month}-{day}"
            );
            // The next day of the calendar, nothing skipped.
            let next = if day > 1 {
                (previous.0, previous.1, previous.2 + 1)
            } else if month > 1 {
                (previous.0, previous.1 + 1, 1)
            } else {
                (previous.0 + 1, 1, 1)
            };
            assert_eq!((year, month, day), next);
            previous = (year, month, day);
        }
        assert_eq!(previous, (9999, 12, 31));
    }

    #[test]
    fn timestamps() {
        assert_eq!(format_timestamp(0, 0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_timestamp(1_709_210_096, 789_000_000).unwrap(),
            "2024-02-29T12:34:56.789Z"
        );
        assert_eq!(
            format_timestamp(-1, 500_000_000).unwrap(),
            "1969-12-31T23:59:59.500Z"
        );
        assert_eq!(
            format_timestamp(MIN_TIMESTAMP, 0).unwrap(),
            "0001-01-01T00:00:00Z"
        );
        assert_eq!(
            format_timestamp(MAX_TIMESTAMP, 999_999_999).unwrap(),
            "9999-12-31T23:59:59.999999999Z"
        );
        assert_eq!(format_timestamp(MAX_TIMESTAMP + 1, 0), None);
        assert_eq!(
            parse_timestamp("2024-02-29T12:34:56.789Z"),
            Some((1_709_210_096, 789_000_000))
        );
        assert_eq!(
            parse_timestamp("2024-02-29T13:34:56+01:00"),
            Some((1_709_210_096, 0))
        );
        assert_eq!(
            parse_timestamp("0001-01-01T00:00:00Z"),
            Some((MIN_TIMESTAMP, 0))
        );
        for bad in [
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-01-01t00:00:00Z",
            "2024-01-01T00:00:00z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00.1234567890Z",
            "0000-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(format_duration(1, 500_000_000).unwrap(), "1.500s");
        assert_eq!(format_duration(0, -1).unwrap(), "-0.000000001s");
        assert_eq!(format_duration(-5, -10_000).unwrap(), "-5.000010s");
        assert_eq!(format_duration(MAX_DURATION + 1, 0), None);
        assert_eq!(format_duration(1, -1), None);
        assert_eq!(format_duration(i64::MIN, 0), None);
        assert_eq!(format_duration(0, i32::MIN), None);
        assert_eq!(format_duration(i64::MIN, i32::MIN), None);
        assert_eq!(parse_duration("1.5s"), Some((1, 500_000_000)));
        assert_eq!(parse_duration("-0.000000001s"), Some((0, -1)));
        assert_eq!(parse_duration("315576000000s"), Some((MAX_DURATION, 0)));
        for bad in [
            "315576000001s",
            "1m",
            "1",
            ".5s",
            "1.s",
            "+1s",
            "1.0000000001s",
            "--1s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn field_mask_paths() {
        assert_eq!(path_to_json("foo_bar.baz_qux").unwrap(), "fooBar.bazQux");
        assert_eq!(path_to_json("foo__bar"), None);
        assert_eq!(path_to_json("foo_3"), None);
        assert_eq!(path_to_json("fooBar"), None);
        // Found by the json fuzz target: ["", ""] printed as "," and came
        // back as no path at all.
        assert_eq!(path_to_json(""), None);
        assert_eq!(path_to_json("a,b"), None);
        assert_eq!(path_from_json("fooBar.bazQux").unwrap(), "foo_bar.baz_qux");
        assert_eq!(path_from_json("foo_bar"), None);
    }
}
