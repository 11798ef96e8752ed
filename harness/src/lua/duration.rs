//! Durations as the Lua API accepts them: seconds as a number, or a string
//! with an `ms`/`s`/`m`/`h` suffix ("500ms", "5s", "2m", "1h").

use std::time::Duration;

use mlua::Value;

/// Parse a duration string. Errors name the offending input.
pub fn parse_duration_str(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, unit) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = num.trim().parse().map_err(|_| {
        format!(
            "bad timeout string `{text}`: expected seconds or a number with ms/s/m/h, e.g. \"5s\""
        )
    })?;
    seconds(value * unit).map_err(|e| format!("bad timeout string `{text}`: {e}"))
}

/// Seconds as a Duration; NaN, infinite and negative values are errors.
pub fn seconds(value: f64) -> Result<Duration, String> {
    if value.is_nan() {
        return Err("value must be a finite number (got NaN)".into());
    }
    if value.is_infinite() {
        return Err("value must be a finite number (got inf)".into());
    }
    if value < 0.0 {
        return Err(format!("value must not be negative (got {value})"));
    }
    Ok(Duration::from_secs_f64(value))
}

/// A duration from a Lua number or string; `what` prefixes the error.
pub fn from_lua(value: &Value, what: &str) -> mlua::Result<Duration> {
    let r = match value {
        Value::Integer(i) => seconds(*i as f64),
        Value::Number(n) => seconds(*n),
        Value::String(s) => parse_duration_str(&s.to_str()?),
        other => Err(format!(
            "expected seconds or a duration string, got {}",
            other.type_name()
        )),
    };
    r.map_err(|e| mlua::Error::runtime(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_refuses_bad_input() {
        assert_eq!(parse_duration_str("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration_str("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration_str("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration_str("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration_str("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration_str("soon")
            .unwrap_err()
            .contains("bad timeout string `soon`"));
        assert!(parse_duration_str("-1s")
            .unwrap_err()
            .contains("must not be negative"));
        assert!(seconds(f64::NAN).unwrap_err().contains("NaN"));
    }
}
