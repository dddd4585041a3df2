//! Wall-clock time as the store, files and wire formats record it.

/// Milliseconds since the Unix epoch; a clock before 1970 reads as 0 rather than failing.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
