//! Sizes on the command line: `65536`, `64K`, `256M`, `1G`, `2T` (powers of 1024; `KiB`,
//! `MiB`... and `KB`, `MB`... are read the same way).

/// Parses a size in bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (write it as 65536, 64K, 256M or 1G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown size unit {unit:?} (K, M, G or T)"
            ));
        }
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
