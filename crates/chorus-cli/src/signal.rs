//! Signal names for messages and summaries, from `signal-hook`'s table of the platform's
//! signals; a number it does not know reads `signal N`.

/// The name of `signal` (`SIGTERM`), or `signal N`.
pub(crate) fn signal_name(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map_or_else(|| format!("signal {signal}"), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::signal_name;

    #[test]
    fn known_signals_have_their_names_and_others_their_numbers() {
        assert_eq!(signal_name(libc::SIGINT), "SIGINT");
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGSTOP), "SIGSTOP");
        assert_eq!(signal_name(200), "signal 200");
    }
}
