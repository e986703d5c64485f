//! `cairn`: run a Cairn node (see `cairn_server::cli`).

// glibc malloc showed up at ~12% of server CPU in the write-path profile (fragmented
// small allocations across worker threads); mimalloc's per-thread heaps cut that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cairn_server::cli::main()
}
