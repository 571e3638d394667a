//! Sizes in bytes, as people write them and as TITAN prints them.

/// "4GiB", "512MiB", "2.5GB", "1000000" -> bytes; why not for anything else.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 4GiB, 512MiB, auto)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => {
            return Err(format!(
                "unknown size unit {u:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let bytes = n * mult;
    // `as` would turn a size past u64 into u64::MAX without a word.
    if bytes >= u64::MAX as f64 {
        return Err(format!("{s:?} is more than 16 EiB"));
    }
    Ok(bytes as u64)
}

/// "512 B", "1.50 KiB", "16.00 GiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("1234").unwrap(), 1234);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("99999999999999999999999TiB")
            .unwrap_err()
            .contains("more than 16 EiB"));
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(512 << 20), "512.00 MiB");
    }
}
