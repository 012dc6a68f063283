//! A prompt as users' files hold it: a string, or a list of chat messages
//! `[{"role": …, "content": …}]` (verl's files, OpenAI's format).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{kind, DataError, Record};
use std::path::Path;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or another role the template knows.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl Message {
    /// A user turn.
    pub fn user(content: &str) -> Self {
        Self { role: "user".into(), content: content.into() }
    }
}

/// A prompt: plain text, or a conversation to render with the model's chat template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text.
    Text(String),
    /// Chat messages.
    Chat(Vec<Message>),
}

impl Record {
    /// The prompt at `path`: a string, or a non-empty list of `{"role", "content"}` objects with
    /// string values; anything else is an error naming the field, the message and the line.
    pub fn prompt(&self, file: &Path, path: &str) -> Result<Prompt, DataError> {
        let error = |reason: String| DataError::Line { path: file.to_path_buf(), line: self.line, reason };
        match super::field(&self.value, path) {
            None => Err(error(format!("no field `{path}`"))),
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(list)) if list.is_empty() => Err(error(format!("field `{path}` is an empty list"))),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, m)| message(m).map_err(|why| error(format!("`{path}[{i}]` {why}"))))
                .collect::<Result<_, _>>()
                .map(Prompt::Chat),
            Some(other) => {
                Err(error(format!("field `{path}` is {}, not a string or a list of chat messages", kind(other))))
            }
        }
    }
}

/// One `{"role", "content"}` object, or why it is not one.
fn message(value: &Value) -> Result<Message, String> {
    let object =
        value.as_object().ok_or_else(|| format!("is {}, not a {{\"role\", \"content\"}} object", kind(value)))?;
    let text = |key: &str| match object.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("has `{key}` as {}, not a string", kind(other))),
        None => Err(format!("has no `{key}`")),
    };
    Ok(Message { role: text("role")?, content: text("content")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_strings_or_messages_and_errors_name_the_message() {
        let record = |v: Value| Record { line: 3, value: v };
        let f = Path::new("p.jsonl");
        let chat = serde_json::json!({"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]});
        assert_eq!(
            record(chat).prompt(f, "prompt").unwrap(),
            Prompt::Chat(vec![Message { role: "system".into(), content: "be brief".into() }, Message::user("2+2?")])
        );
        assert_eq!(record(serde_json::json!({"q": {"t": "hi"}})).prompt(f, "q.t").unwrap(), Prompt::Text("hi".into()));
        for (value, needle) in [
            (serde_json::json!({"prompt": [{"role": "user"}]}), "p.jsonl:3: `prompt[0]` has no `content`"),
            (serde_json::json!({"prompt": [{"role": "user", "content": 1}]}), "`prompt[0]` has `content` as a number"),
            (serde_json::json!({"prompt": ["x"]}), "`prompt[0]` is a string, not a"),
            (serde_json::json!({"prompt": []}), "field `prompt` is an empty list"),
            (serde_json::json!({"prompt": 7}), "field `prompt` is a number, not a string or a list"),
            (serde_json::json!({"text": "x"}), "no field `prompt`"),
        ] {
            let e = record(value).prompt(f, "prompt").unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
