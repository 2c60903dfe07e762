//! Human units on the command line: `5s`, `500ms`, `2m`; `256M`, `256MiB`, `1G`, `512k`.

use std::time::Duration;

/// A duration with a unit: `ms`, `s`, `m` or `h`; decimals allowed (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale_ms = match unit.trim() {
        "ms" => 1.0,
        "s" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "" => {
            return Err(format!(
                "{text:?} needs a unit: ms, s, m or h (e.g. 5s, 500ms)"
            ))
        }
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    let ms = value * scale_ms;
    if !ms.is_finite() || !(1.0..=1e12).contains(&ms) {
        return Err(format!("{text:?} is out of range (at least 1ms)"));
    }
    Ok(Duration::from_millis(ms.round() as u64))
}

/// A size in bytes: a bare number is bytes; `k`, `M`, `G` (with optional `i`/`iB`/`B`) are
/// powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let scale: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit (use k, M, G, e.g. 256M or 1GiB)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// A size that must be a whole number of MiB (memory and disk limits).
pub fn parse_mib(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if bytes % (1 << 20) != 0 {
        return Err(format!(
            "{text:?} is not a whole number of MiB (e.g. 256M, 1G)"
        ));
    }
    Ok(bytes >> 20)
}

/// A size for people to read, in the binary units `doctor` uses: `812 bytes`, `257 KiB`,
/// `1.5 MiB`, `12 MiB`, `2.0 GiB` (one decimal below ten, none above).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(812), "812 bytes");
        assert_eq!(human_size(257 << 10), "257 KiB");
        assert_eq!(human_size(263_168), "257 KiB");
        assert_eq!(human_size(1536 << 10), "1.5 MiB");
        assert_eq!(human_size(12 << 20), "12 MiB");
        assert_eq!(human_size(2 << 30), "2.0 GiB");
        assert_eq!(human_size(1023), "1023 bytes");
        assert_eq!(human_size(1024), "1.0 KiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("256mb"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn mib_sizes_must_be_whole() {
        assert_eq!(parse_mib("1G"), Ok(1024));
        assert_eq!(parse_mib("256MiB"), Ok(256));
        assert!(parse_mib("1500K")
            .unwrap_err()
            .contains("whole number of MiB"));
    }
}
