//! The `0-3,8,10-11` notation of Linux cpulists, Slurm and MPI, for CPUs, devices and ranks.

/// Renders sorted indices compactly: `[0, 1, 2, 5, 7, 8]` → `0-2,5,7-8`.
pub fn format_index_list<T>(indices: &[T]) -> String
where
    T: Copy + Into<i64>,
{
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start: i64 = indices[i].into();
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1].into() == end + 1 {
            i += 1;
            end = indices[i].into();
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    parts.join(",")
}

/// Why an index list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexListError {
    /// A piece is neither a number nor a range `a-b` with `a <= b`.
    Malformed(String),
    /// An index is past the largest the caller allows (checked before anything is expanded:
    /// `0-4294967295` must not allocate 16 GB to be refused).
    Above {
        /// The index.
        index: u64,
        /// The largest allowed.
        limit: u32,
    },
}

impl std::fmt::Display for IndexListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexListError::Malformed(piece) => write!(f, "`{piece}` is neither an index nor a range like 0-5"),
            IndexListError::Above { index, limit } => write!(f, "index {index} is past the largest allowed, {limit}"),
        }
    }
}

/// Parses `0-3,8,10-11` (whitespace tolerated), refusing any index above `limit` before a range
/// is expanded.
pub fn parse_index_list(text: &str, limit: u32) -> Result<Vec<u32>, IndexListError> {
    let number = |t: &str| -> Result<u64, IndexListError> {
        t.trim().parse::<u64>().map_err(|_| IndexListError::Malformed(t.trim().to_string()))
    };
    let bounded = |index: u64| -> Result<u32, IndexListError> {
        u32::try_from(index).ok().filter(|&i| i <= limit).ok_or(IndexListError::Above { index, limit })
    };
    let mut out = Vec::new();
    for piece in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match piece.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(IndexListError::Malformed(piece.to_string()));
                }
                let (a, b) = (bounded(a)?, bounded(b)?);
                out.extend(a..=b);
            }
            None => out.push(bounded(number(piece)?)?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_compacts_runs() {
        assert_eq!(format_index_list(&[0i32, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_index_list(&[3u32]), "3");
        assert_eq!(format_index_list::<u32>(&[]), "");
    }

    #[test]
    fn parse_inverts_format() {
        let cpus = vec![0u32, 1, 2, 3, 8, 10, 11];
        assert_eq!(parse_index_list(&format_index_list(&cpus), 11), Ok(cpus));
        assert_eq!(parse_index_list(" 4 , 6-7\n", 7), Ok(vec![4, 6, 7]));
        assert_eq!(parse_index_list("GPU-5a1b", 100), Err(IndexListError::Malformed("GPU".into())));
        assert_eq!(parse_index_list("3-1", 100), Err(IndexListError::Malformed("3-1".into())));
    }

    #[test]
    fn indices_past_the_limit_are_refused_before_anything_is_expanded() {
        let start = std::time::Instant::now();
        assert_eq!(parse_index_list("0-4294967295", 7), Err(IndexListError::Above { index: 4294967295, limit: 7 }));
        assert_eq!(
            parse_index_list("0-99999999999999999999", 7),
            Err(IndexListError::Malformed("99999999999999999999".into()))
        );
        assert_eq!(parse_index_list("0-8", 7), Err(IndexListError::Above { index: 8, limit: 7 }));
        assert!(start.elapsed().as_millis() < 100, "nothing was expanded");
    }
}
