//! tunelab's entry point; the command line lives in `tunelab::cli`.

fn main() -> std::process::ExitCode {
    let code = tunelab::cli::main(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
