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

/// Parses `0-3,8,10-11` (whitespace tolerated); `None` if any piece is not a number or range.
pub fn parse_index_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for piece in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match piece.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(piece.parse().ok()?),
        }
    }
    Some(out)
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
        assert_eq!(parse_index_list(&format_index_list(&cpus)), Some(cpus));
        assert_eq!(parse_index_list(" 4 , 6-7\n"), Some(vec![4, 6, 7]));
        assert_eq!(parse_index_list("GPU-5a1b"), None);
        assert_eq!(parse_index_list("3-1"), None);
    }
}
