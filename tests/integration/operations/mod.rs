//! Running the broker: start-up checks and fail-closed restore, shutdown, crashes, disk and memory alarms, limits, the routing table's key limits, `ferrymq ctl`.

mod crash_loop;
mod ctl;
mod disk_alarm;
mod disk_full;
mod limits;
mod listener_limits;
mod restore_fail_closed;
mod routing_limits;
mod shutdown;
mod startup;
