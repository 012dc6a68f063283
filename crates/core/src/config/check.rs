//! Small range checks shared by every section's `validate()`, so each rule is written once and
//! every message has the same shape: key, value, what is accepted.

use super::ConfigError;

/// Most devices a job or a plan may have (2^20): far past any cluster, small enough that
/// per-device tables stay small.
pub const MAX_DEVICES: u32 = 1 << 20;
/// Most tokens in a prompt or a response (2^20).
pub const MAX_TOKENS: u32 = 1 << 20;
/// Most sequences per RL step (2^20).
pub const MAX_SEQUENCES: u32 = 1 << 20;
/// Most memory one device (or, on CPU-only nodes, one rank) may have, in GB: 64 TB, past the
/// largest accelerator (a few hundred GB) and the largest shared-memory node.
pub const MAX_DEVICE_MEMORY_GB: f64 = 65_536.0;
/// Longest collective time limit: one week, in seconds.
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;
/// Shortest collective time limit, in seconds: below it the watchdog would fire on a healthy
/// job's first barrier.
pub const MIN_TIMEOUT_S: f64 = 0.1;

/// A collective time limit (`job.collective_timeout_s`, `--collective-timeout`) in
/// `[MIN_TIMEOUT_S, MAX_TIMEOUT_S]`.
pub fn timeout(key: &str, value: f64) -> Result<(), ConfigError> {
    within(key, value, MIN_TIMEOUT_S, MAX_TIMEOUT_S)
}

/// A float as a person reads it: plain where that is short, scientific otherwise (so `f64::MAX`
/// is `1.7976931348623157e308`, not 309 digits).
pub fn show(value: f64) -> String {
    if value != 0.0 && !(1e-4..1e15).contains(&value.abs()) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// `1 <= value <= max` for counts with an upper bound.
pub fn between(key: &str, value: u32, max: u32) -> Result<(), ConfigError> {
    if value == 0 || value > max {
        return Err(ConfigError::invalid(key, value, format!("must be between 1 and {max}")));
    }
    Ok(())
}

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
        return Err(ConfigError::invalid(key, show(value), "must be a finite number greater than 0"));
    }
    Ok(())
}

/// A finite number in the closed interval `[lo, hi]`.
pub fn within(key: &str, value: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ConfigError::invalid(key, show(value), format!("must lie in [{}, {}]", show(lo), show(hi))));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_and_tiny_floats_are_shown_briefly() {
        assert_eq!(show(f64::MAX), "1.7976931348623157e308");
        assert_eq!(show(1e30), "1e30");
        assert_eq!(show(0.5), "0.5");
        assert_eq!(show(120.0), "120");
        assert_eq!(show(1e-9), "1e-9");
        assert!(within("k", 1e30, 0.0, MAX_TIMEOUT_S).unwrap_err().to_string().contains("= 1e30"));
    }
}
