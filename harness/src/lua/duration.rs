//! Durations as the Lua API accepts them: seconds as a number, or a string
//! with an `ms`/`s`/`m`/`h` suffix ("500ms", "5s", "2m", "1h").

use std::time::Duration;

use mlua::Value;

/// Why a value is not a duration; each names the offending input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DurationError {
    #[error(
        "bad timeout string `{text}`: expected seconds or a number with ms/s/m/h, e.g. \"5s\""
    )]
    BadString { text: String },
    /// A string whose number is not a valid duration.
    #[error("bad timeout string `{text}`")]
    BadValue {
        text: String,
        #[source]
        source: ValueError,
    },
    #[error("expected seconds or a duration string, got {type_name}")]
    WrongType { type_name: &'static str },
    #[error(transparent)]
    Value(#[from] ValueError),
}

/// Why a number of seconds is not a duration.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValueError {
    #[error("value must be a finite number (got NaN)")]
    NaN,
    #[error("value must be a finite number (got inf)")]
    Infinite,
    #[error("value must not be negative (got {value})")]
    Negative { value: f64 },
}

/// Parse a duration string. Errors name the offending input.
pub fn parse_duration_str(text: &str) -> Result<Duration, DurationError> {
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
    let value: f64 = num.trim().parse().map_err(|_| DurationError::BadString {
        text: text.to_string(),
    })?;
    seconds(value * unit).map_err(|source| DurationError::BadValue {
        text: text.to_string(),
        source,
    })
}

/// Seconds as a Duration; NaN, infinite and negative values are errors.
pub fn seconds(value: f64) -> Result<Duration, ValueError> {
    if value.is_nan() {
        return Err(ValueError::NaN);
    }
    if value.is_infinite() {
        return Err(ValueError::Infinite);
    }
    if value < 0.0 {
        return Err(ValueError::Negative { value });
    }
    Ok(Duration::from_secs_f64(value))
}

/// A duration from a Lua number or string; `what` prefixes the error.
pub fn from_lua(value: &Value, what: &str) -> mlua::Result<Duration> {
    let r = match value {
        Value::Integer(i) => seconds(*i as f64).map_err(DurationError::from),
        Value::Number(n) => seconds(*n).map_err(DurationError::from),
        Value::String(s) => parse_duration_str(&s.to_str()?),
        other => Err(DurationError::WrongType {
            type_name: other.type_name(),
        }),
    };
    r.map_err(|e| mlua::Error::runtime(format!("{what}: {}", crate::error_chain::flatten(&e))))
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
        let text = |e: DurationError| crate::error_chain::flatten(&e);
        assert!(text(parse_duration_str("soon").unwrap_err()).contains("bad timeout string `soon`"));
        assert_eq!(
            text(parse_duration_str("-1s").unwrap_err()),
            "bad timeout string `-1s`: value must not be negative (got -1)",
            "the string, then why, once"
        );
        assert!(seconds(f64::NAN).unwrap_err().to_string().contains("NaN"));
    }
}
