//! `--set section.key=value`: any key of the job file, from the command line. The value is read
//! as a TOML value (`--set rl.prompts_per_step=32`, `--set reward.command='["python3", "s.py"]'`),
//! or as a string when it is not one (`--set job.output_dir=runs/x`), then checked by the same
//! typed sections as the file, so a wrong type or an unknown key is the same error, naming the
//! flag.

use serde::de::DeserializeOwned;

use super::ConfigError;

/// One `--set KEY=VALUE`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    /// The dotted key (`plan."actor/training".tp`: quoted parts may hold dots).
    pub key: String,
    /// The value as written.
    pub value: String,
}

impl KeySet {
    /// The key's parts (`["plan", "actor/training", "tp"]`).
    pub fn path(&self) -> Option<Vec<String>> {
        key_path(&self.key)
    }
}

impl std::str::FromStr for KeySet {
    type Err = String;

    fn from_str(s: &str) -> Result<KeySet, String> {
        let (key, value) = s.split_once('=').ok_or_else(|| format!("`{s}` is not KEY=VALUE (section.key=value)"))?;
        let key = key.trim();
        if key_path(key).is_none_or(|parts| parts.len() < 2) {
            return Err(format!("`{key}` is not a dotted key with its section (`rl.prompts_per_step`)"));
        }
        Ok(KeySet { key: key.to_string(), value: value.trim().to_string() })
    }
}

/// The parts of a dotted key, `"…"` quoting a part that holds dots; `None` when malformed.
fn key_path(key: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut rest = key;
    loop {
        let (part, after) = match rest.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (quoted[..end].to_string(), &quoted[end + 1..])
            }
            None => {
                let end = rest.find('.').unwrap_or(rest.len());
                (rest[..end].trim().to_string(), &rest[end..])
            }
        };
        if part.is_empty() {
            return None;
        }
        parts.push(part);
        match after.strip_prefix('.') {
            Some(next) => rest = next,
            None if after.is_empty() => return Some(parts),
            None => return None,
        }
    }
}

/// The value of `--set`: TOML when it parses as one TOML value, else the text as a string. Text
/// that parses as more than one key (`"x"` then a newline and `steps = 1`) is refused rather
/// than cut to its first value, and so is a bare string holding a control character, which no
/// TOML string holds unescaped.
fn toml_value(text: &str) -> Result<toml::Value, String> {
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut table) if table.len() == 1 => Ok(table.remove("v").expect("the one key is `v`")),
        Ok(table) => {
            let more: Vec<&str> = table.keys().filter(|k| *k != "v").map(String::as_str).collect();
            Err(format!(
                "the value parses as more than one key (`{}` after it): --set takes one value; quote a string that holds a newline or `=`",
                more.join("`, `")
            ))
        }
        Err(_) if text.chars().any(char::is_control) => Err(
            "the value holds a control character (a newline, a tab), which a bare string cannot hold; write it as a quoted TOML string with escapes (\"a\\nb\")"
                .into(),
        ),
        Err(_) => Ok(toml::Value::String(text.to_string())),
    }
}

/// `document` (a job file's text, already known to parse) with `sets` applied, read into `T`.
pub fn apply<T: DeserializeOwned>(document: &str, sets: &[KeySet]) -> Result<T, ConfigError> {
    let mut table: toml::Table = toml::from_str(document).map_err(|e| set_error(&sets[0], e.message().to_string()))?;
    for set in sets {
        let parts = key_path(&set.key).expect("checked when the flag was parsed");
        let (last, sections) = parts.split_last().expect("at least two parts");
        let mut at = &mut table;
        for part in sections {
            let entry = at.entry(part.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = entry
                .as_table_mut()
                .ok_or_else(|| set_error(set, format!("`{part}` is a value in the job file, not a table")))?;
        }
        at.insert(last.clone(), toml_value(&set.value).map_err(|why| set_error(set, why))?);
    }
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|err| {
        let key = err.path().to_string();
        let message = err.into_inner().message().trim().replace('\n', " ");
        let culprit = sets.iter().rev().find(|s| key.starts_with(&s.key) || s.key.starts_with(&key));
        match culprit {
            Some(set) => set_error(set, format!("{message} (at `{key}`)")),
            None => set_error(&sets[0], format!("{message} (at `{key}`)")),
        }
    })
}

fn set_error(set: &KeySet, message: String) -> ConfigError {
    // Control characters escaped, so the flag is named on one line as it was typed.
    let shown = |text: &str| {
        text.chars()
            .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
            .collect::<String>()
    };
    ConfigError::Set { flag: format!("--set {}={}", shown(&set.key), shown(&set.value)), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_on_dots_outside_quotes_and_values_are_typed() {
        assert_eq!(key_path("rl.prompts_per_step").unwrap(), ["rl", "prompts_per_step"]);
        assert_eq!(key_path("plan.\"actor/training\".tp").unwrap(), ["plan", "actor/training", "tp"]);
        assert!(key_path("rl..x").is_none() && key_path("\"a").is_none());
        assert!("rl".parse::<KeySet>().is_err() && "x=1".parse::<KeySet>().is_err());
        assert_eq!(toml_value("32"), Ok(toml::Value::Integer(32)));
        assert_eq!(toml_value("runs/x"), Ok(toml::Value::String("runs/x".into())));
        assert_eq!(toml_value("[\"a\", \"b\"]").unwrap().as_array().unwrap().len(), 2);
        assert_eq!(toml_value("\"\"\"a\nb\"\"\"").unwrap().as_str(), Some("a\nb"), "a quoted newline is a value");
        assert!(toml_value("\"x\"\nsteps = 1").unwrap_err().contains("more than one key (`steps` after it)"));
        assert!(toml_value("x\ny").unwrap_err().contains("control character"));
    }
}
