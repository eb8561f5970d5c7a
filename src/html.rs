//! HTML escaping, the one rule shared by the web UI (`http::ui`) and the notifications that
//! carry HTML (e-mail, Matrix): every value from PVE, the repository or the store goes through
//! [`escape`] before it meets markup.

/// `text` safe as HTML element content and as a double- or single-quoted attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_characters_become_entities_and_other_text_stays() {
        assert_eq!(
            escape(r#"<script>alert('x' & "y")</script> é"#),
            "&lt;script&gt;alert(&#39;x&#39; &amp; &quot;y&quot;)&lt;/script&gt; é"
        );
    }
}
