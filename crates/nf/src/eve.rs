//! What the detectors' alerts share: pieces of Suricata's EVE JSON lines (each NF writes its
//! own `alert` object; see [`crate::ALERT_TARGET`]).

use flowstate_state::Nanos;

/// `ns` since the Unix epoch as Suricata's EVE timestamp (`2024-01-02T03:04:05.678901+0000`).
pub(crate) fn timestamp(ns: Nanos) -> String {
    let secs = ns / 1_000_000_000;
    let micros = (ns % 1_000_000_000) / 1_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}+0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// EVE's `proto` for IP protocol number `p`: `TCP`, `UDP`, `ICMP`, else the number.
pub(crate) fn proto(p: u8) -> String {
    match p {
        6 => "TCP".to_string(),
        17 => "UDP".to_string(),
        1 => "ICMP".to_string(),
        p => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000000+0000");
        assert_eq!(
            timestamp(1_709_251_199_123_456_789),
            "2024-02-29T23:59:59.123456+0000"
        );
        // 2024-02-29T12:34:56.789012Z
        assert_eq!(
            timestamp(1_709_210_096_789_012_345),
            "2024-02-29T12:34:56.789012+0000"
        );
    }

    #[test]
    fn protocols() {
        assert_eq!(
            (proto(6), proto(17), proto(1), proto(47)),
            ("TCP".into(), "UDP".into(), "ICMP".into(), "47".into())
        );
    }
}
