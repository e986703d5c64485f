//! Ages and periods as people write them in flags and manifests: `90s`, `45m`, `12h`,
//! `30d`, `2w` (one unit, a whole number). Shared by the CLI's retention flags and the
//! operator's `spec.backup.retention.maxAge`, so both accept exactly the same text.

/// Seconds of an age written as a whole number and one unit (`s`, `m`, `h`, `d`, `w`).
pub fn parse_age(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 90s, 45m, 12h, 30d or 2w"))?;
    let (digits, unit) = text.split_at(split);
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: write a whole number and a unit, e.g. 30d"))?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (s, m, h, d or w)"
            ));
        }
    };
    count
        .checked_mul(unit_secs)
        .filter(|secs| *secs > 0)
        .ok_or_else(|| {
            format!("{text:?}: an age is more than zero and less than 584 billion years")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_counts_its_seconds() {
        assert_eq!(parse_age("90s"), Ok(90));
        assert_eq!(parse_age("45m"), Ok(2_700));
        assert_eq!(parse_age("12h"), Ok(43_200));
        assert_eq!(parse_age("30d"), Ok(2_592_000));
        assert_eq!(parse_age(" 2w "), Ok(1_209_600));
    }

    #[test]
    fn text_without_a_known_unit_or_count_is_refused() {
        for bad in [
            "",
            "30",
            "d",
            "1.5h",
            "-3d",
            "3 d",
            "3y",
            "0d",
            "99999999999999999999w",
        ] {
            assert!(parse_age(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
