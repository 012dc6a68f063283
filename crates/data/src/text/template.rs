//! Chat templates, rendered as transformers renders them: Jinja with `trim_blocks` and
//! `lstrip_blocks`, loop controls, Python's string and dict methods, the `raise_exception` and
//! `strftime_now` helpers, a `tojson` that writes what Python's `json.dumps` writes, and the
//! special tokens (`bos_token`, `eos_token`, …) in the context.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Output, State};

use nereus_core::file_error::read_regular_string;
use nereus_core::thread_budget::{run_bounded, Overrun};

use super::special::read_object;
use super::{SpecialTokens, TextError};
use crate::records::Message;

const NAME: &str = "chat_template";

/// Instructions one rendering may run (minijinja's fuel). The Llama-3- and Qwen3-style
/// templates render a 60,000-message conversation within it; a loop that runs on (a nested
/// 10^5 × 10^4 loop) stops within half a second.
pub const MAX_INSTRUCTIONS: u64 = 10_000_000;
/// Bytes one rendered prompt may hold: 16 MiB is several times the longest prompt any model
/// reads (2^20 tokens of a few bytes each).
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;
/// Bytes one rendering may hold at once, the strings it builds included (a template that
/// doubles a string stops here rather than at the machine's memory).
pub const MAX_RENDER_BYTES: usize = 256 << 20;
/// Time one rendering may take: a last bound for a single built-in call that is slow without
/// running many instructions.
pub const MAX_RENDER_TIME: Duration = Duration::from_secs(20);

/// A model's chat template, compiled.
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    origin: PathBuf,
}

impl ChatTemplate {
    /// The template of `dir`: `chat_template.jinja`, `chat_template.json`, or
    /// `tokenizer_config.json`'s `chat_template` (a string, or named templates: `default`);
    /// `None` when the directory has none.
    pub fn load(dir: &Path) -> Result<Option<Self>, TextError> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let source = read_regular_string(&jinja)?;
            return Self::compile(source, &jinja).map(Some);
        }
        for file in ["chat_template.json", "tokenizer_config.json"] {
            let path = dir.join(file);
            if let Some(source) = template_in_json(&path)? {
                return Self::compile(source, &path).map(Some);
            }
        }
        Ok(None)
    }

    /// Compiles `source` (read from `origin`, named in errors).
    pub fn compile(source: String, origin: &Path) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(MAX_INSTRUCTIONS));
        env.set_formatter(finite_formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source).map_err(|e| TextError::Invalid {
            path: origin.to_path_buf(),
            reason: format!("the chat template does not compile: {e}"),
        })?;
        Ok(Self { env: Arc::new(env), origin: origin.to_path_buf() })
    }

    /// `messages` rendered, with the assistant's turn opened when `add_generation_prompt`; on a
    /// thread of its own, within [`MAX_INSTRUCTIONS`], [`MAX_OUTPUT_BYTES`], [`MAX_RENDER_BYTES`]
    /// and [`MAX_RENDER_TIME`].
    pub fn render(
        &self,
        messages: &[Message],
        special: &SpecialTokens,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let (env, messages, special) = (Arc::clone(&self.env), messages.to_vec(), special.clone());
        let rendered = run_bounded(MAX_RENDER_BYTES, MAX_RENDER_TIME, move || {
            render_capped(&env, &messages, &special, add_generation_prompt)
        });
        let reason = match rendered {
            Ok(Ok(text)) => return Ok(text),
            Ok(Err(e)) => e,
            Err(Overrun::Memory(bytes)) => format!(
                "it holds more than {} at once while rendering (the limit; a string that keeps growing?)",
                nereus_core::units::format_bytes(bytes as u64)
            ),
            Err(Overrun::Time(limit)) => format!("it ran past the limit of {} s", limit.as_secs()),
            Err(Overrun::Lost) => "its rendering thread could not run".into(),
        };
        Err(TextError::Render { path: self.origin.clone(), reason })
    }
}

/// Renders into a writer that refuses more than [`MAX_OUTPUT_BYTES`]; the error says which limit
/// stopped it, if one did.
fn render_capped(
    env: &Environment<'static>,
    messages: &[Message],
    special: &SpecialTokens,
    add_generation_prompt: bool,
) -> Result<String, String> {
    let template = env.get_template(NAME).map_err(|e| describe(&e))?;
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => special.bos_token,
        eos_token => special.eos_token,
        pad_token => special.pad_token,
        unk_token => special.unk_token,
        tools => (),
        documents => (),
    };
    let mut out = CappedWriter { bytes: Vec::new(), full: false };
    match template.render_captured_to(ctx, &mut out) {
        Ok(_) => String::from_utf8(out.bytes).map_err(|_| "the output is not UTF-8".into()),
        Err(_) if out.full => Err(format!("its output passed the limit of {MAX_OUTPUT_BYTES} bytes")),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(format!(
            "it ran past the limit of {MAX_INSTRUCTIONS} instructions (a loop that does not end, or loops nested too deep)"
        )),
        Err(e) => Err(describe(&e)),
    }
}

/// The rendered bytes, refusing any write past [`MAX_OUTPUT_BYTES`].
struct CappedWriter {
    bytes: Vec<u8>,
    full: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_OUTPUT_BYTES {
            self.full = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// minijinja's formatter, except that a number that is not finite is an error: minijinja's
/// `1 / 0` is `inf` where transformers' Jinja (Python) raises `ZeroDivisionError`, and a float
/// `%` or `//` by zero or a `**` that overflows raise there too.
fn finite_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    check_finite(value)?;
    minijinja::escape_formatter(out, state, value)
}

/// An error when `value` is a number that is not finite.
fn check_finite(value: &Value) -> Result<(), Error> {
    match f64::try_from(value.clone()) {
        Ok(x) if value.is_number() && !x.is_finite() => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("the template computed {x} (a division by zero?), where transformers' Jinja raises"),
        )),
        _ => Ok(()),
    }
}

/// The error and the chain of causes below it, on one line.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The template string in a JSON file's `chat_template`, if the file and the key exist.
fn template_in_json(path: &Path) -> Result<Option<String>, TextError> {
    let Some(object) = read_object(path)? else { return Ok(None) };
    let invalid = |reason: String| TextError::Invalid { path: path.to_path_buf(), reason };
    match object.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(named)) => {
            let pick = |want: Option<&str>| {
                named.iter().find(|t| want.is_none_or(|w| t.get("name").and_then(|n| n.as_str()) == Some(w)))
            };
            let chosen = pick(Some("default")).or_else(|| pick(None));
            chosen
                .and_then(|t| t.get("template")?.as_str())
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| invalid("`chat_template` is a list without a {\"name\", \"template\"} entry".into()))
        }
        Some(_) => Err(invalid("`chat_template` is neither a string nor a list of named templates".into())),
    }
}

/// `raise_exception(message)`: templates call it to refuse a conversation they cannot render.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: today's date (UTC) in the `%d`, `%m`, `%Y`, `%b`, `%B` subset the
/// published templates use.
fn strftime_now(format: String) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let name = MONTHS[month as usize - 1];
    format
        .replace("%d", &format!("{day:02}"))
        .replace("%m", &format!("{month:02}"))
        .replace("%Y", &year.to_string())
        .replace("%B", name)
        .replace("%b", &name[..3])
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's civil-from-days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `tojson` as transformers defines it: Python's `json.dumps(x, ensure_ascii=False)`, so `", "`
/// and `": "` between items and keys in the order they were written (or `indent=N` lines).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Appends `json.dumps(value, ensure_ascii=False, indent=indent)` at nesting `depth` to `out`.
fn python_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) -> Result<(), Error> {
    let (open, close, items): (char, char, Vec<(Option<Value>, Value)>) = match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => ('[', ']', value.try_iter()?.map(|v| (None, v)).collect()),
        ValueKind::Map => {
            let keys = value.try_iter()?.collect::<Vec<_>>();
            (
                '{',
                '}',
                keys.into_iter().map(|k| Ok((Some(k.clone()), value.get_item(&k)?))).collect::<Result<_, Error>>()?,
            )
        }
        ValueKind::Undefined | ValueKind::None => {
            out.push_str("null");
            return Ok(());
        }
        _ => {
            check_finite(value)?;
            let text =
                serde_json::to_string(value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            out.push_str(&text);
            return Ok(());
        }
    };
    out.push(open);
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    for (i, (key, item)) in items.iter().enumerate() {
        out.push_str(if i == 0 {
            ""
        } else if indent.is_some() {
            ","
        } else {
            ", "
        });
        newline(out, depth + 1);
        if let Some(key) = key {
            python_json(&Value::from(key.to_string()), None, 0, out)?;
            out.push_str(": ");
        }
        python_json(item, indent, depth + 1, out)?;
    }
    if !items.is_empty() {
        newline(out, depth);
    }
    out.push(close);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_json_match_python() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let t = ChatTemplate::compile(
            r#"{{ {"b": [1, 2.5, "x\"é"], "a": none, "c": {}} | tojson }}|{{ [1, {"k": true}] | tojson(indent=2) }}"#
                .into(),
            Path::new("t"),
        )
        .unwrap();
        let special = SpecialTokens {
            bos_token: None,
            eos_token: None,
            pad_token: None,
            unk_token: None,
            eos_ids: vec![0],
            pad_id: 0,
        };
        let text = t.render(&[], &special, false).unwrap();
        assert_eq!(text, "{\"b\": [1, 2.5, \"x\\\"é\"], \"a\": null, \"c\": {}}|[\n  1,\n  {\n    \"k\": true\n  }\n]");
    }
}
