//! The one cause-chain formatter: an error and its `source()` chain on one line,
//! `what: cause: cause`, for logs, records and the CLI. Error types here never repeat their
//! source in their own message, so each cause appears once.

/// `error` with its causes on one line (the client's errors never contain the token).
pub fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the config")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_error_and_its_causes_are_written_once_each_on_one_line() {
        let error = Outer(std::io::Error::other("permission denied"));
        assert_eq!(error_text(&error), "reading the config: permission denied");
    }
}
