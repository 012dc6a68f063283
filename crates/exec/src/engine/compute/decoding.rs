//! A decode's state in device memory ([`DeviceDecoding`]): the tokens, lengths, finished
//! flags and last tokens of [`HostDecoding`] as `int` arrays the sampler and
//! `nereus_decode_advance` update in stream order, so a token step needs no host wait, and the
//! row counter that makes a token step replayable: the position of the rows the next step
//! feeds, which every position-dependent kernel of the step adds to its arguments and the
//! advance moves on by one. The host keeps a copy of what the counter holds (it knows how many
//! advances it enqueued), so an argument is always `position − counter`. Like the token ids a
//! pass uploads, these few `int` arrays are not charged to the rank's ledger (the cost model
//! prices activations, not ids).

use crate::backend::gpu::{Device, DeviceArray, DevicePtr, Graph};
use crate::backend::BackendError;
use crate::engine::decode::{DecodeShape, Generated, HostDecoding};
use crate::engine::sampling::Sampling;

/// A decode's state on a device (see the module comment).
pub struct DeviceDecoding<'d> {
    /// The recorded token step, once there is one (dropped first: it names the arrays below).
    pub graph: Option<Graph<'d>>,
    /// The row counter `[1]`: the position of the rows the next token step feeds.
    pub position: DeviceArray<'d, i32>,
    /// What `position` holds once the work enqueued so far has run.
    pub row: i64,
    /// The shape decoded.
    pub shape: DecodeShape,
    /// Tokens `[B, T_cap]`.
    pub tokens: DeviceArray<'d, i32>,
    /// Response tokens so far `[B]`.
    pub lengths: DeviceArray<'d, i32>,
    /// Finished flags `[B]` (0 or 1).
    pub done: DeviceArray<'d, i32>,
    /// The tokens at the last position written `[B]` (the next step embeds them).
    pub last: DeviceArray<'d, i32>,
    /// The sampler's draws of the current step `[B]`.
    pub drawn: DeviceArray<'d, i32>,
    /// Sequence ids `[B]` (they seed the draws).
    pub ids: DeviceArray<'d, u64>,
    /// Stop ids, `eos` first.
    pub stops: DeviceArray<'d, i32>,
    /// Stop ids held.
    pub n_stops: usize,
    /// What a finished sequence holds.
    pub eos: u32,
    /// Token steps between reads of the finished flags.
    pub check_every: usize,
}

impl<'d> DeviceDecoding<'d> {
    /// The state [`HostDecoding::new`] starts from, uploaded.
    pub fn upload(
        device: &'d Device,
        prompts: &[u32],
        ids: &[u64],
        shape: DecodeShape,
        s: &Sampling,
    ) -> Result<Self, BackendError> {
        let host = HostDecoding::new(prompts, ids, shape, s);
        let zeros = || DeviceArray::<i32>::zeros(device, shape.b);
        // The prefill's draw writes position `p`: its rows are one before.
        let row = shape.p as i64 - 1;
        Ok(DeviceDecoding {
            graph: None,
            position: DeviceArray::from(device, &[row as i32])?,
            row,
            shape,
            tokens: DeviceArray::from(device, &as_int(&host.tokens))?,
            lengths: zeros()?,
            done: zeros()?,
            last: DeviceArray::from(device, &as_int(&host.last))?,
            drawn: zeros()?,
            ids: DeviceArray::from(device, ids)?,
            stops: DeviceArray::from(device, &as_int(&host.stops))?,
            n_stops: host.stops.len(),
            eos: s.eos,
            check_every: s.stop_check_every.max(1),
        })
    }

    /// The counter and the offset that makes it position `pos` now (see [`relative_to`]).
    pub fn at(&self, pos: usize) -> (DevicePtr, u64) {
        relative_to(self.position.ptr(), self.row, pos)
    }

    /// Whether every sequence has ended (one wait).
    pub fn finished(&self) -> Result<bool, BackendError> {
        Ok(self.done.read()?.iter().all(|&d| d != 0))
    }

    /// The tokens at the last position written (one wait).
    pub fn last_tokens(&self) -> Result<Vec<u32>, BackendError> {
        Ok(self.last.read()?.into_iter().map(|t| t as u32).collect())
    }

    /// The tokens and response lengths (two reads, after everything enqueued).
    pub fn generated(&self) -> Result<Generated, BackendError> {
        let tokens = self.tokens.read()?.into_iter().map(|t| t as u32).collect();
        let lengths = self.lengths.read()?.into_iter().map(|n| n as usize).collect();
        Ok(Generated { tokens, lengths })
    }
}

/// What a kernel is given for position `pos` when the row counter at `counter` holds `row`:
/// the counter, and the offset a kernel adds to it (`pos − row`, wrapping, as the kernels add
/// in `u64`).
pub fn relative_to(counter: DevicePtr, row: i64, pos: usize) -> (DevicePtr, u64) {
    (counter, (pos as u64).wrapping_sub(row as u64))
}

/// Token ids as the kernels read them.
pub fn as_int(tokens: &[u32]) -> Vec<i32> {
    tokens.iter().map(|&t| t as i32).collect()
}
