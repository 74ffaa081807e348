//! Runtime compilers: NVRTC (CUDA) and hiprtc (HIP), opened at run time from
//! the library [`locate`](super::locate) finds. Both have the same C API
//! under their own prefix; only the call that returns the binary differs
//! (`nvrtcGetCUBIN`, `hiprtcGetCode`).
//!
//! cudarc's own NVRTC loader tries only names the system linker resolves
//! (`libnvrtc.so.12`, ...), which misses the NVRTC of a pip wheel
//! (`site-packages/nvidia/cu13/lib/libnvrtc.so.13`); so the library is opened
//! by path here, with cudarc's type for a program handle.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys::nvrtcProgram as Program;

/// Which runtime compiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    Nvrtc,
    Hiprtc,
}

impl Flavor {
    fn prefix(self) -> &'static str {
        match self {
            Flavor::Nvrtc => "nvrtc",
            Flavor::Hiprtc => "hiprtc",
        }
    }

    /// The call returning the compiled binary (a cubin; a code object).
    fn binary_call(self) -> &'static str {
        match self {
            Flavor::Nvrtc => "CUBIN",
            Flavor::Hiprtc => "Code",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Nvrtc => "NVRTC",
            Flavor::Hiprtc => "hiprtc",
        }
    }
}

// The C signatures; results are plain ints so that a code this build does
// not know is a number, never an invalid enum.
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type NameFn = unsafe extern "C" fn(Program, *const c_char) -> c_int;
type LoweredFn = unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type ErrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// An opened runtime compiler.
pub struct Rtc {
    pub flavor: Flavor,
    pub path: PathBuf,
    /// (major, minor)
    pub version: (i32, i32),
    create: CreateFn,
    destroy: DestroyFn,
    compile: CompileFn,
    add_name: NameFn,
    lowered: LoweredFn,
    binary_size: SizeFn,
    binary: BytesFn,
    log_size: SizeFn,
    log: BytesFn,
    error: ErrorFn,
    // Keeps the function pointers above valid.
    _lib: libloading::Library,
}

/// What one compile produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The loadable image: a cubin (CUDA) or code object (HIP).
    pub image: Vec<u8>,
    /// The kernel's symbol in the image (the mangled name of `name_expression`).
    pub symbol: String,
    /// The compiler's log (warnings), possibly empty.
    pub log: String,
}

/// A failed compile: the compiler's log, or why it could not run.
#[derive(Debug, Clone)]
pub struct CompileError {
    pub message: String,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Rtc {
    /// Opens the library at `path` and looks up every call it needs.
    pub fn open(flavor: Flavor, path: &Path) -> Result<Rtc, String> {
        // SAFETY: loading a shared library runs its initialisers; NVRTC's and
        // hiprtc's have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let p = flavor.prefix();
        macro_rules! sym {
            ($name:expr, $ty:ty) => {{
                let name = format!("{p}{}\0", $name);
                // SAFETY: the symbol is the documented C function of this type.
                let f: libloading::Symbol<'_, $ty> = unsafe { lib.get(name.as_bytes()) }
                    .map_err(|e| format!("{} lacks {p}{}: {e}", path.display(), $name))?;
                *f
            }};
        }
        let version_fn = sym!("Version", VersionFn);
        let mut version = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { version_fn(&mut version.0, &mut version.1) };
        let bin = flavor.binary_call();
        Ok(Rtc {
            flavor,
            path: path.to_path_buf(),
            version,
            create: sym!("CreateProgram", CreateFn),
            destroy: sym!("DestroyProgram", DestroyFn),
            compile: sym!("CompileProgram", CompileFn),
            add_name: sym!("AddNameExpression", NameFn),
            lowered: sym!("GetLoweredName", LoweredFn),
            binary_size: sym!(format!("Get{bin}Size"), SizeFn),
            binary: sym!(format!("Get{bin}"), BytesFn),
            log_size: sym!("GetProgramLogSize", SizeFn),
            log: sym!("GetProgramLog", BytesFn),
            error: sym!("GetErrorString", ErrorFn),
            _lib: lib,
        })
    }

    /// "NVRTC 13.2 (/path/libnvrtc.so.13)"
    pub fn describe(&self) -> String {
        format!(
            "{} {}.{} ({})",
            self.flavor.name(),
            self.version.0,
            self.version.1,
            self.path.display()
        )
    }

    fn error_text(&self, code: c_int) -> String {
        // SAFETY: the call returns a static string for any code.
        let text = unsafe { (self.error)(code) };
        if text.is_null() {
            return format!("error {code}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// Compiles `source` (named `file_name` in messages) with `options`, and
    /// returns the image and the symbol of `name_expression` (a kernel name,
    /// with template arguments where it has them).
    pub fn compile(
        &self,
        source: &str,
        file_name: &str,
        name_expression: &str,
        options: &[String],
    ) -> Result<Compiled, CompileError> {
        let fail = |m: String| CompileError { message: m };
        let src = CString::new(source).map_err(|_| fail("the source holds a NUL byte".into()))?;
        let file = CString::new(file_name).map_err(|_| fail("bad file name".into()))?;
        let expr = CString::new(name_expression).map_err(|_| fail("bad kernel name".into()))?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| fail("an option holds a NUL byte".into()))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings; no headers.
        let code = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                file.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if code != 0 {
            return Err(fail(format!(
                "{}CreateProgram: {}",
                self.flavor.prefix(),
                self.error_text(code)
            )));
        }
        let guard = ProgramGuard { rtc: self, prog };
        // SAFETY: a live program and a NUL-terminated expression.
        let code = unsafe { (self.add_name)(prog, expr.as_ptr()) };
        if code != 0 {
            return Err(fail(format!(
                "cannot name the kernel `{name_expression}`: {}",
                self.error_text(code)
            )));
        }
        // SAFETY: a live program and an array of valid option strings.
        let code = unsafe { (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = self.read(prog, self.log_size, self.log);
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        if code != 0 {
            return Err(fail(if log.is_empty() {
                self.error_text(code)
            } else {
                log
            }));
        }
        let mut symbol: *const c_char = std::ptr::null();
        // SAFETY: the expression was added before compiling.
        let code = unsafe { (self.lowered)(prog, expr.as_ptr(), &mut symbol) };
        if code != 0 || symbol.is_null() {
            return Err(fail(format!(
                "the source compiled but defines no kernel `{name_expression}`: {}",
                self.error_text(code)
            )));
        }
        // SAFETY: a NUL-terminated string owned by the live program.
        let symbol = unsafe { CStr::from_ptr(symbol) }
            .to_string_lossy()
            .into_owned();
        let image = self.read(prog, self.binary_size, self.binary);
        drop(guard);
        if image.is_empty() {
            return Err(fail(format!(
                "{} produced no binary (is the architecture option a real GPU, sm_XX / gfxXXX?)",
                self.flavor.name()
            )));
        }
        Ok(Compiled { image, symbol, log })
    }

    fn read(&self, prog: Program, size: SizeFn, bytes: BytesFn) -> Vec<u8> {
        let mut n = 0usize;
        // SAFETY: a live program; valid out-pointer.
        if unsafe { size(prog, &mut n) } != 0 || n == 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: the buffer holds the size the library asked for.
        if unsafe { bytes(prog, buf.as_mut_ptr().cast()) } != 0 {
            return Vec::new();
        }
        buf
    }
}

struct ProgramGuard<'a> {
    rtc: &'a Rtc,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created and is destroyed once.
        unsafe { (self.rtc.destroy)(&mut self.prog) };
    }
}

// SAFETY: the function pointers and the library handle may be used from any
// thread; NVRTC and hiprtc programs are per call and never shared.
unsafe impl Send for Rtc {}
unsafe impl Sync for Rtc {}
