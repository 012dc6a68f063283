//! The device collectives of the GPU data plane on disjoint communicators: the lower and upper
//! half of the world made at once (by `ncclCommSplit` where the library has it), and each
//! rank's pair made by its members alone (by a unique id); all-gather, broadcast and all-reduce
//! on device buffers, every result depending on every member.

use nereus_exec::comm::collectives::DataType;
use nereus_exec::comm::gpu_plane::DeviceGroup;
use nereus_exec::comm::DataPlane;
use nereus_exec::emu::{DeviceMemory, ShardMemory};
use nereus_runtime::device::Plane;
use nereus_runtime::RuntimeError;

/// Runs the collectives on both kinds of communicator; a wrong result on any rank is a failure.
pub fn check(
    plane: &mut Plane<'_>,
    memory: &DeviceMemory,
    world: i32,
    failures: &mut Vec<String>,
) -> Result<(), RuntimeError> {
    let me = plane.rank();
    let half = (world / 2).max(1);
    let partition: Vec<Vec<i32>> =
        [(0..half).collect::<Vec<i32>>(), (half..world).collect()].into_iter().filter(|g| !g.is_empty()).collect();
    let halves = plane.device_groups(&partition)?.expect("every rank is in one half");
    let first = me - me % 2;
    let pair = plane.device_group(&(first..(first + 2).min(world)).collect::<Vec<i32>>())?;
    let mut wrong = Vec::new();
    for (name, group) in [("half", halves), ("pair", pair)] {
        if !collectives_agree(plane, memory, group)? {
            wrong.push(format!(
                "device collectives on the {name} {:?} gave wrong results on rank {me}",
                plane.members(group)
            ));
        }
    }
    let mut flags = [wrong.len() as u64];
    let all = plane.group(&(0..world).collect::<Vec<_>>())?;
    plane.all_reduce_sum_u64(all, &mut flags)?;
    if flags[0] > 0 {
        failures.push(
            wrong.first().cloned().unwrap_or_else(|| format!("device collectives failed on {} rank(s)", flags[0])),
        );
    }
    Ok(())
}

/// All-gather of 8 bytes per member, broadcast from the first member, all-reduce of 4 f32.
fn collectives_agree(plane: &mut Plane<'_>, memory: &DeviceMemory, group: DeviceGroup) -> Result<bool, RuntimeError> {
    let (me, members) = (plane.rank(), plane.members(group).to_vec());
    let n = members.len() as u64;
    let (mut mine, all, mut root, mut sum) =
        (memory.allocate(8)?, memory.allocate(8 * n)?, memory.allocate(8)?, memory.allocate(16)?);
    memory.write(&[me as u8 + 1; 8], &mut mine)?;
    memory.write(&[100 + me as u8; 8], &mut root)?;
    memory.write(bytemuck::cast_slice(&[me as f32 + 1.0; 4]), &mut sum)?;
    plane.all_gather(group, mine.ptr(), all.ptr(), 8)?;
    plane.broadcast(group, 0, root.ptr(), 8)?;
    plane.all_reduce_sum(group, sum.ptr(), 4, DataType::F32)?;
    plane.synchronize()?;
    let gathered: Vec<u8> = members.iter().flat_map(|&r| [r as u8 + 1; 8]).collect();
    let total: f32 = members.iter().map(|&r| r as f32 + 1.0).sum();
    let summed: Vec<u8> = bytemuck::cast_slice(&[total; 4]).to_vec();
    Ok(*memory.read(&all)? == gathered[..]
        && *memory.read(&root)? == [100 + members[0] as u8; 8]
        && *memory.read(&sum)? == summed[..])
}
