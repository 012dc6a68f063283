//! The `math` rule: find a response's final answer, normalise it, and compare it with the
//! reference as a number where both are numbers.
//!
//! Extraction, in order: the last `\boxed{…}` (or `\fbox{…}`, braces matched, nested ones
//! kept); the text after the last "the answer is" (any case) up to the line's or sentence's
//! end; the last number in the text (`-1,234.5`, `3/4`). Normalisation drops `$`, `\(`…`\)`,
//! `\[`…`\]`, `\left`/`\right`, spacing commands, degree marks, `%` and `\%`, unwraps `\text{…}`
//! and `\mathrm{…}`, reads `\dfrac`/`\tfrac` as `\frac`, removes whitespace, a trailing period,
//! a leading `x =` and thousands separators. A number is a decimal, `a/b`, or `\frac{a}{b}`
//! (`\frac12` too), with a sign; two numbers match within a relative 1e-6.

/// A final answer found in a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The answer's text as written (not yet normalised).
    pub text: String,
    /// Whether it came from `\boxed{…}` (the format the bonus is for).
    pub boxed: bool,
}

/// The response's final answer, if it gives one.
pub fn extract(response: &str) -> Option<Found> {
    if let Some(text) = extract_boxed(response) {
        return Some(Found { text, boxed: true });
    }
    extract_stated(response).or_else(|| last_number(response)).map(|text| Found { text, boxed: false })
}

/// The content of the last `\boxed{…}` or `\fbox{…}` (braces matched), or of `\boxed X` (up
/// to the next space or `$`).
pub fn extract_boxed(text: &str) -> Option<String> {
    let (at, command) =
        ["\\boxed", "\\fbox"].iter().filter_map(|c| text.rfind(c).map(|at| (at, *c))).max_by_key(|(at, _)| *at)?;
    let rest = &text[at + command.len()..];
    if let Some(inner) = rest.strip_prefix('{') {
        // Unbalanced: no answer rather than a guess.
        return matching_brace(inner).map(|end| inner[..end].trim().to_string());
    }
    let token: String = rest.strip_prefix(' ')?.chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
    (!token.is_empty()).then_some(token)
}

/// The text after the last "the answer is" (any case), up to the end of its line or sentence.
fn extract_stated(text: &str) -> Option<String> {
    const PHRASE: &str = "the answer is";
    // ASCII lower-casing keeps every byte offset, so `at` indexes `text` too.
    let lower = text.to_ascii_lowercase();
    let at = lower.rfind(PHRASE)? + PHRASE.len();
    let rest = text[at..].trim_start_matches([' ', ':', '\t']);
    let line = rest.lines().next().unwrap_or("");
    let sentence = line.split(". ").next().unwrap_or(line).trim().trim_end_matches('.');
    (!sentence.is_empty()).then(|| sentence.to_string())
}

/// The last number in `text`: `-1,234.5`, `0.25`, `3/4` (thousands separators only before
/// groups of three digits).
fn last_number(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let digits = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut last = None;
    let mut i = 0;
    while i < b.len() {
        let signed = b[i] == b'-' && i + 1 < b.len() && b[i + 1].is_ascii_digit();
        if !(b[i].is_ascii_digit() || signed) {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = digits(i + usize::from(signed));
        while end + 3 < b.len() + 1 && b[end..].first() == Some(&b',') && digits(end + 1) == end + 4 {
            end += 4;
        }
        if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
            end = digits(end + 1);
        }
        if b.get(end) == Some(&b'/') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
            end = digits(end + 1);
        }
        last = Some(text[start..end].to_string());
        i = end;
    }
    last
}

/// The answer in a canonical written form (see the module's list).
pub fn normalize(answer: &str) -> String {
    let mut s = answer.trim().to_string();
    for (from, to) in [("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^{\\circ}", ""), ("^\\circ", "")] {
        s = s.replace(from, to);
    }
    for command in ["\\text", "\\textbf", "\\mathrm", "\\mathbf"] {
        s = unwrap_command(&s, command);
    }
    for noise in
        ["\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\%", "%", "\\$", "$", "\\(", "\\)", "\\[", "\\]"]
    {
        s = s.replace(noise, "");
    }
    s.retain(|c| !c.is_whitespace());
    let s = s.trim_end_matches('.');
    let s = match s.as_bytes() {
        [v, b'=', ..] if v.is_ascii_alphabetic() => &s[2..],
        _ => s,
    };
    drop_thousands_separators(s)
}

/// `\command{X}` → `X`, for every occurrence.
fn unwrap_command(s: &str, command: &str) -> String {
    let open = format!("{command}{{");
    let mut out = s.to_string();
    while let Some(at) = out.find(&open) {
        let inner_start = at + open.len();
        let Some(len) = matching_brace(&out[inner_start..]) else { break };
        let inner = out[inner_start..inner_start + len].to_string();
        out.replace_range(at..inner_start + len + 1, &inner);
    }
    out
}

/// The byte length up to the `}` closing an already opened brace.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Commas between a digit and a group of exactly three digits are removed.
fn drop_thousands_separators(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        let group = |k: usize| b.get(k).is_some_and(u8::is_ascii_digit);
        let separator =
            c == ',' && i > 0 && b[i - 1].is_ascii_digit() && (1..=3).all(|k| group(i + k)) && !group(i + 4);
        if !separator {
            out.push(c);
        }
    }
    out
}

/// The value of a normalised answer that is a number: a decimal, `a/b` or `\frac{a}{b}`
/// (`\frac12`), with an optional sign.
pub fn value(normalized: &str) -> Option<f64> {
    let (sign, s) = match normalized.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, normalized.strip_prefix('+').unwrap_or(normalized)),
    };
    let decimal = |t: &str| -> Option<f64> {
        let ok = !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit() || c == b'.') && t.bytes().any(|c| c != b'.');
        ok.then(|| t.parse().ok()).flatten()
    };
    let ratio = |a: f64, b: f64| (b != 0.0).then_some(a / b);
    let v = if let Some(frac) = s.strip_prefix("\\frac") {
        let (num, den) = match frac.strip_prefix('{') {
            Some(inner) => {
                let n = matching_brace(inner)?;
                let den = inner[n + 1..].strip_prefix('{')?;
                let d = matching_brace(den)?;
                if d + 1 != den.len() {
                    return None;
                }
                (&inner[..n], &den[..d])
            }
            None if frac.len() == 2 && frac.is_ascii() => (&frac[..1], &frac[1..]),
            None => return None,
        };
        ratio(decimal(num)?, decimal(den)?)?
    } else if let Some((num, den)) = s.split_once('/') {
        ratio(decimal(num)?, decimal(den)?)?
    } else {
        decimal(s)?
    };
    Some(sign * v)
}

/// Whether `answer` matches `reference`: equal normalised text, or two numbers within a
/// relative 1e-6.
pub fn equivalent(answer: &str, reference: &str) -> bool {
    let (a, r) = (normalize(answer), normalize(reference));
    if a.is_empty() {
        return false;
    }
    if a == r {
        return true;
    }
    match (value(&a), value(&r)) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * y.abs().max(1.0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_answer_is_found_in_order_of_preference() {
        let boxed = extract("First 3, then \\boxed{\\frac{1}{2}} and 9").unwrap();
        assert_eq!((boxed.text.as_str(), boxed.boxed), ("\\frac{1}{2}", true));
        assert_eq!(extract_boxed("\\boxed{a{b}c} \\fbox{d}").as_deref(), Some("d"));
        assert_eq!(extract_boxed("$\\boxed 42$").as_deref(), Some("42"));
        assert_eq!(extract_boxed("\\boxed{unbalanced"), None);
        let stated = extract("We get 5 apples. The answer is: $12$. Then 99").unwrap();
        assert_eq!((stated.text.as_str(), stated.boxed), ("$12$", false));
        assert_eq!(extract("So THE ANSWER IS 1,234.50 dollars").unwrap().text, "1,234.50 dollars");
        assert_eq!(extract("12 + 7 = 8").unwrap().text, "8");
        assert_eq!(extract("from -3 to 1,234,567 and 3/4").unwrap().text, "3/4");
        assert_eq!(extract("pairs 3, 456 and 1,23").unwrap().text, "23");
        assert_eq!(extract("x-1 is 2.5.").unwrap().text, "2.5");
        assert_eq!(extract("no digits"), None);
    }

    #[test]
    fn answers_normalise_and_compare_as_numbers() {
        assert_eq!(normalize(" $1,234,567$. "), "1234567");
        assert_eq!(normalize("\\left( 3 \\right)"), "(3)");
        assert_eq!(normalize("x = \\dfrac{3}{4}"), "\\frac{3}{4}");
        assert_eq!(normalize("90^\\circ"), "90");
        assert_eq!(normalize("\\text{ 12 apples}"), "12apples");
        assert_eq!(value("\\frac{3}{4}"), Some(0.75));
        assert_eq!(value("-\\frac12"), Some(-0.5));
        assert_eq!(value("3/0"), None);
        assert_eq!(value("1e3"), None, "no exponents: `e` is not a digit");
        assert_eq!(value("."), None);
        assert_eq!(value("\\fracé"), None, "two bytes, one character: not \\frac12");
        assert!(!equivalent("\\fracé", "0.5"));
        assert_eq!(extract("İstanbul, 3 → THE ANSWER IS ½").unwrap().text, "½");
        for (a, r) in [
            ("2.50", "5/2"),
            ("\\dfrac{5}{2}", "2.5"),
            ("1,000", "1000"),
            ("50\\%", "50"),
            ("0.3333333", "1/3"),
            ("-4", "-4.0"),
        ] {
            assert!(equivalent(a, r), "{a} vs {r}");
        }
        assert!(!equivalent("\\text{Paris}", "paris"), "text compares exactly after normalisation");
        assert!(equivalent("\\text{Paris}", "Paris"));
        assert!(!equivalent("0.33", "1/3"));
        assert!(!equivalent("", ""));
        assert!(!equivalent("8", "19"));
    }
}
