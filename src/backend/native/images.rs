//! Compiling native methods: a job's config turned into template arguments
//! and defines, the method's source compiled by the runtime compiler (NVRTC,
//! hiprtc) for the lane's GPU, the image kept on disk by a key over
//! everything that went into it, so a resumed run or the `aot` output finds
//! it again. Compiles of one key run once, whoever asks first; others wait.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::backend::JobFailure;
use crate::device::DeviceInfo;
use crate::manifest::{device_fields, Expr, Method, NativeSpec};
use crate::native::rtc::{Flavor, Rtc};
use crate::plan::Job;
use crate::store::FailureClass;

/// tunelab's own kernels (spin, L2 flush, comparison), compiled for the lane's GPU.
const HELPERS: &str = include_str!("../../native/helpers.cu");

/// A compiled kernel on disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// The image file (`<key>.cubin`, `<key>.hsaco`).
    pub image: PathBuf,
    /// The kernel's symbol in the image.
    pub symbol: String,
    /// What compiled it ("NVRTC 13.2 (path)").
    pub compiler: String,
    /// The options it was compiled with.
    pub options: Vec<String>,
    /// The name expression (kernel and template arguments).
    pub name_expression: String,
    /// Warnings the compiler printed.
    pub log: String,
    /// Seconds the compile took when it ran (0 when found on disk).
    #[serde(skip)]
    pub seconds: f64,
}

type Slot = Arc<OnceLock<Result<Artifact, JobFailure>>>;

/// The runner's compiler of native methods, shared by the compile pool and
/// the lanes.
pub struct NativeCompiler {
    flavor: Flavor,
    /// `sm_90`, `gfx942`.
    arch: String,
    python: Option<PathBuf>,
    cache_dir: PathBuf,
    device: Json,
    rtc: OnceLock<Result<Arc<Rtc>, String>>,
    sources: Mutex<HashMap<PathBuf, Result<Arc<String>, String>>>,
    slots: Mutex<HashMap<String, Slot>>,
}

impl NativeCompiler {
    /// A compiler for `device`'s GPU, keeping images in `cache_dir`; the
    /// runtime compiler is looked for beside `python`'s packages first.
    pub fn new(device: &DeviceInfo, python: Option<&Path>, cache_dir: PathBuf) -> NativeCompiler {
        let flavor = if device.backend == "hip" {
            Flavor::Hiprtc
        } else {
            Flavor::Nvrtc
        };
        NativeCompiler {
            flavor,
            arch: device.arch.clone(),
            python: python.map(Path::to_path_buf),
            cache_dir,
            device: Json::Object(device_fields(device)),
            rtc: OnceLock::new(),
            sources: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The runtime compiler, opened on first use; why not, when it cannot be.
    pub fn rtc(&self) -> Result<Arc<Rtc>, String> {
        self.rtc
            .get_or_init(|| {
                crate::native::locate::open(self.flavor, self.python.as_deref()).map(Arc::new)
            })
            .clone()
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// The architecture option of the runtime compiler.
    fn arch_option(&self) -> Result<String, String> {
        match self.flavor {
            Flavor::Nvrtc => {
                if !self.arch.starts_with("sm_") {
                    return Err(format!(
                        "cannot compile CUDA for device architecture `{}`",
                        self.arch
                    ));
                }
                Ok(format!("-arch={}", self.arch))
            }
            Flavor::Hiprtc => Ok(format!("--offload-arch={}", self.arch)),
        }
    }

    fn source(&self, path: &Path) -> Result<Arc<String>, String> {
        let mut sources = self.sources.lock().expect("sources");
        sources
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                std::fs::read_to_string(path)
                    .map(Arc::new)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))
            })
            .clone()
    }

    /// The image of `job` of native method `method`, compiling it unless a
    /// compile of the same key ran (or runs) already.
    pub fn compile(&self, method: &Method, job: &Job) -> Result<Artifact, JobFailure> {
        let spec = method.native.as_ref().ok_or_else(|| {
            JobFailure::new(
                FailureClass::ProblemError,
                format!("method `{}` is not a native method", method.name),
            )
        })?;
        let ctx = context(job, &self.device);
        let request = self.request(&method.kernel, spec, &ctx)?;
        self.compile_request(request)
    }

    /// What compiling `spec` for this context means: its source, name
    /// expression and options, and the key over all of them.
    fn request(
        &self,
        kernel: &str,
        spec: &NativeSpec,
        ctx: &Map<String, Json>,
    ) -> Result<Request, JobFailure> {
        let problem = |m: String| JobFailure::new(FailureClass::ProblemError, m);
        let source = self.source(&spec.source).map_err(problem)?;
        let mut options = vec![self.arch_option().map_err(problem)?];
        if self.flavor == Flavor::Nvrtc {
            options.push("-std=c++17".into());
        }
        if let Some(dir) = spec.source.parent() {
            options.push(format!("-I{}", dir.display()));
        }
        for (name, e) in &spec.defines {
            options.push(format!("-D{name}={}", cpp_text(&eval(e, ctx)?)));
        }
        options.extend(spec.options.iter().cloned());
        let name_expression = if spec.template.is_empty() {
            kernel.to_string()
        } else {
            let args: Vec<String> = spec
                .template
                .iter()
                .map(|e| eval(e, ctx).map(|v| cpp_text(&v)))
                .collect::<Result<_, _>>()?;
            format!("{kernel}<{}>", args.join(", "))
        };
        let file_name = spec
            .source
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kernel.cu".into());
        let rtc = self
            .rtc()
            .map_err(|e| JobFailure::new(FailureClass::Unavailable, e))?;
        let mut key = blake3::Hasher::new();
        for part in [
            rtc.describe().as_str(),
            file_name.as_str(),
            source.as_str(),
            name_expression.as_str(),
        ] {
            key.update(part.as_bytes());
            key.update(b"\0");
        }
        for o in &options {
            key.update(o.as_bytes());
            key.update(b"\0");
        }
        Ok(Request {
            key: key.finalize().to_hex()[..24].to_string(),
            rtc,
            source,
            file_name,
            name_expression,
            options,
        })
    }

    fn compile_request(&self, r: Request) -> Result<Artifact, JobFailure> {
        let slot = {
            let mut slots = self.slots.lock().expect("compile slots");
            Arc::clone(slots.entry(r.key.clone()).or_default())
        };
        slot.get_or_init(|| self.build(&r)).clone()
    }

    /// Compiles (or reads from disk) one request.
    fn build(&self, r: &Request) -> Result<Artifact, JobFailure> {
        let ext = match self.flavor {
            Flavor::Nvrtc => "cubin",
            Flavor::Hiprtc => "hsaco",
        };
        let image = self.cache_dir.join(format!("{}.{ext}", r.key));
        let meta = self.cache_dir.join(format!("{}.json", r.key));
        if let (true, Ok(text)) = (image.is_file(), std::fs::read_to_string(&meta)) {
            if let Ok(found) = serde_json::from_str::<Artifact>(&text) {
                return Ok(Artifact { image, ..found });
            }
        }
        let started = Instant::now();
        let compiled = r
            .rtc
            .compile(&r.source, &r.file_name, &r.name_expression, &r.options)
            .map_err(|e| {
                JobFailure::new(
                    FailureClass::CompileError,
                    format!(
                        "{} of `{}` failed:\n{}",
                        r.rtc.flavor.name(),
                        r.name_expression,
                        e.message
                    ),
                )
            })?;
        let seconds = started.elapsed().as_secs_f64();
        let artifact = Artifact {
            image: image.clone(),
            symbol: compiled.symbol,
            compiler: r.rtc.describe(),
            options: r.options.clone(),
            name_expression: r.name_expression.clone(),
            log: compiled.log,
            seconds,
        };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.cache_dir)?;
            // Written under a temporary name and renamed, so a reader never sees half a file.
            let tmp = image.with_extension(format!("{ext}.tmp{}", std::process::id()));
            std::fs::write(&tmp, &compiled.image)?;
            std::fs::rename(&tmp, &image)?;
            let tmp = meta.with_extension(format!("json.tmp{}", std::process::id()));
            std::fs::write(
                &tmp,
                serde_json::to_string_pretty(&artifact).expect("artifact") + "\n",
            )?;
            std::fs::rename(&tmp, &meta)
        };
        write().map_err(|e| {
            JobFailure::new(
                FailureClass::CompileError,
                format!(
                    "cannot write the compiled image to {}: {e}",
                    self.cache_dir.display()
                ),
            )
        })?;
        Ok(artifact)
    }

    /// Compiles one source file as it is (`tunelab native-compile`) for this GPU.
    pub fn compile_source(
        &self,
        file_name: &str,
        source: &str,
        kernel: &str,
    ) -> Result<Artifact, JobFailure> {
        self.compile_fixed(file_name, source, kernel, false)
    }

    /// tunelab's own kernels (src/native/helpers.cu: the spin, the L2
    /// flush, the comparison), as every run compiles them for its native
    /// workers. Without multiply-add contraction: tunelab_compare must round
    /// `atol + rtol * |ref|` twice, as torch does, to reproduce Python's
    /// verdict bit for bit.
    pub fn compile_helpers(&self) -> Result<Artifact, JobFailure> {
        self.compile_fixed("tunelab_helpers.cu", HELPERS, "tunelab_spin", true)
    }

    fn compile_fixed(
        &self,
        file_name: &str,
        source: &str,
        kernel: &str,
        exact_fp: bool,
    ) -> Result<Artifact, JobFailure> {
        let rtc = self
            .rtc()
            .map_err(|e| JobFailure::new(FailureClass::Unavailable, e))?;
        let problem = |m: String| JobFailure::new(FailureClass::ProblemError, m);
        let mut options = vec![self.arch_option().map_err(problem)?];
        if self.flavor == Flavor::Nvrtc {
            options.push("-std=c++17".into());
        }
        if exact_fp {
            options.push(match self.flavor {
                Flavor::Nvrtc => "--fmad=false".into(),
                Flavor::Hiprtc => "-ffp-contract=off".into(),
            });
        }
        let mut key = blake3::Hasher::new();
        for part in [rtc.describe().as_str(), file_name, source, kernel] {
            key.update(part.as_bytes());
            key.update(b"\0");
        }
        for o in &options {
            key.update(o.as_bytes());
        }
        self.compile_request(Request {
            key: key.finalize().to_hex()[..24].to_string(),
            rtc,
            source: Arc::new(source.to_string()),
            file_name: file_name.to_string(),
            name_expression: kernel.to_string(),
            options,
        })
    }
}

struct Request {
    key: String,
    rtc: Arc<Rtc>,
    source: Arc<String>,
    file_name: String,
    name_expression: String,
    options: Vec<String>,
}

/// What a job's expressions see: its shape fields, its config and `device`.
pub fn context(job: &Job, device: &Json) -> Map<String, Json> {
    let mut ctx = Map::new();
    for (k, v) in job.shape.iter().chain(job.config.iter()) {
        ctx.insert(k.clone(), v.clone());
    }
    ctx.insert("device".into(), device.clone());
    ctx
}

/// Evaluates an expression of a native method for one job.
pub fn eval(e: &Expr, ctx: &Map<String, Json>) -> Result<Json, JobFailure> {
    crate::expr::evaluate(&e.source, ctx)
        .map(|v| v.to_json())
        .map_err(|m| {
            JobFailure::new(
                FailureClass::ProblemError,
                format!("`{}` (at {}): {m}", e.source, e.span),
            )
        })
}

/// A value as C++ source text: numbers and booleans as literals, strings as
/// written (a type name or a token for a template argument).
pub fn cpp_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Bool(b) => b.to_string(),
        Json::Null => "0".into(),
        other => other.to_string(),
    }
}
