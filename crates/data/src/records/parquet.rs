//! Parquet prompt files (verl's format, pandas' and `datasets`' `to_parquet`): every row as a
//! JSON object, nested structs as objects and lists as arrays, so a row reads as the same record
//! its JSON-lines form would, and fields are found by the same dotted keys.
//!
//! Read with the `parquet` crate's record API. Snappy-compressed and uncompressed pages are read
//! (pyarrow's and pandas' default is snappy); a file compressed with another codec is an error
//! naming the codec.

use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use serde_json::{Map, Value};

use nereus_core::file_error::open_regular;

use super::{kind, DataError, Record};

/// Every row of the Parquet file at `path` as a record numbered from 1. A file that is not
/// Parquet, is truncated, or uses a codec this build does not read is an error naming the file
/// (and the row where reading stopped).
pub fn read_parquet(path: &Path) -> Result<Vec<Record>, DataError> {
    let file = open_regular(path)?;
    let whole = |reason: String| DataError::Format { path: path.to_path_buf(), reason };
    let reader = SerializedFileReader::new(file).map_err(|e| whole(format!("not a readable Parquet file: {e}")))?;
    let rows = reader.get_row_iter(None).map_err(|e| whole(format!("cannot read its rows: {e}")))?;
    let mut records = Vec::new();
    for (k, row) in rows.enumerate() {
        let line = k + 1;
        let row = row.map_err(|e| DataError::Line { path: path.to_path_buf(), line, reason: reason(&e) })?;
        let value = row_value(&row);
        if !value.is_object() {
            let reason = format!("a record must be an object, found {}", kind(&value));
            return Err(DataError::Line { path: path.to_path_buf(), line, reason });
        }
        records.push(Record { line, value });
    }
    if records.is_empty() {
        return Err(DataError::Empty { path: path.to_path_buf() });
    }
    Ok(records)
}

/// What went wrong, with the remedy when it is a codec this build leaves out.
fn reason(e: &parquet::errors::ParquetError) -> String {
    match e {
        parquet::errors::ParquetError::General(m) | parquet::errors::ParquetError::NYI(m)
            if m.contains("Disabled feature") =>
        {
            format!("{m}: Nereus reads snappy-compressed and uncompressed Parquet (pyarrow: `compression=\"snappy\"`)")
        }
        other => other.to_string(),
    }
}

/// A row as a JSON object, column by column.
fn row_value(row: &Row) -> Value {
    Value::Object(row.get_column_iter().map(|(name, field)| (name.clone(), field_value(field))).collect())
}

/// A Parquet value as JSON: structs as objects, lists as arrays, maps as objects keyed by
/// their keys' text, and scalars as `Field::to_json_value` gives them.
fn field_value(field: &Field) -> Value {
    match field {
        Field::Group(row) => row_value(row),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_value).collect()),
        Field::MapInternal(map) => {
            let entries = map.entries().iter().map(|(key, value)| {
                let key = match field_value(key) {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                (key, field_value(value))
            });
            Value::Object(entries.collect::<Map<String, Value>>())
        }
        scalar => scalar.to_json_value(),
    }
}
