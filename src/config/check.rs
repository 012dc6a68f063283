//! Small range checks shared by every section's `validate()`, so each rule is written once and
//! every message has the same shape: key, value, what is accepted.

use super::ConfigError;

/// `value >= 1` for counts (layers, ranks, steps, batch sizes).
pub fn at_least_one(key: &str, value: u32) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::invalid(key, value, "must be at least 1"));
    }
    Ok(())
}

/// A finite number strictly greater than zero (memory, bandwidth, FLOP/s, learning rates).
pub fn positive(key: &str, value: f64) -> Result<(), ConfigError> {
    if !value.is_finite() || value <= 0.0 {
        return Err(ConfigError::invalid(key, value, "must be a finite number greater than 0"));
    }
    Ok(())
}

/// A finite number in the closed interval `[lo, hi]`.
pub fn within(key: &str, value: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ConfigError::invalid(key, value, format!("must lie in [{lo}, {hi}]")));
    }
    Ok(())
}

/// `divisor` divides `value` exactly; `what` explains the relation in the message.
pub fn divides(key: &str, divisor: u32, value: u32, what: &str) -> Result<(), ConfigError> {
    if divisor == 0 || !value.is_multiple_of(divisor) {
        return Err(ConfigError::invalid(key, divisor, format!("must divide {what} ({value})")));
    }
    Ok(())
}
