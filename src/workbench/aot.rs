//! Writing the `aot` output (docs/native-backend.md, "AOT export"): after a
//! run, each folder's winners become specialisations of a C dispatcher
//! (`crate::emit::aot` renders it).
//!
//! Per folder (the output's path rendered per shape, as for every output):
//! the shapes' winners among the methods the output takes (`kind: cuda`
//! methods, Triton methods with `grid:` and `args:`; the output's `method:`
//! only, when it names one), fastest first: a winner that cannot be exported
//! is left out with its reason and the shape's next method is tried. Images
//! come from the native compile cache (a cuda winner is compiled again by
//! NVRTC: a hit on disk) and from a compile worker (a Triton winner is
//! compiled again: a hit in the run's Triton cache), which also reports the
//! kernel's parameters as compiled and Triton's specialisation of them.
//!
//! A Triton winner compiled with an argument divisible by 16 or equal to 1
//! that depends on `M` holds only for such M; a second image of the same
//! config, compiled at M + 1, serves the other Ms of its bucket.
//!
//! Exporting never fails the run: what could not be exported is said (on
//! stderr and in the folder's index.md) and the other outputs follow.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::Value as Json;

use crate::backend::native::images::{context, eval};
use crate::backend::native::NativeCompiler;
use crate::backend::PythonBackend;
use crate::emit::aot::cexpr::{self, CEnv, CVal};
use crate::emit::aot::{self, Condition, Interface, LeftOut, Library, Param, Spec};
use crate::emit::{select, triton_mbucket, Selection};
use crate::expr::Val;
use crate::manifest::{device_fields, Experiment, KernelArg, Method, MethodKind, OutputFormat};
use crate::plan::Job;
use crate::store::{JobRecord, OutputSpec, Results, RunHeader};

/// A compiled Triton kernel: its cubin and what `tunelab.workbench.dump`
/// wrote of it (`metadata`, `launch`).
pub struct TritonKernel {
    pub cubin: Vec<u8>,
    pub meta: Json,
}

/// Where Triton images come from.
pub trait TritonImages {
    /// The one kernel `job` (of Triton method kernel `kernel`) compiles, at
    /// `job.shape`.
    fn kernel(&mut self, job: &Job, kernel: &str) -> Result<TritonKernel, String>;
}

/// Triton images from a compile worker (`keep_ir` into a scratch folder).
pub struct WorkerImages {
    worker: PythonBackend,
    scratch: PathBuf,
    next: usize,
}

impl WorkerImages {
    pub fn new(worker: PythonBackend, scratch: PathBuf) -> WorkerImages {
        WorkerImages {
            worker,
            scratch,
            next: 0,
        }
    }

    pub fn shutdown(&mut self) {
        self.worker.shutdown();
    }
}

impl TritonImages for WorkerImages {
    fn kernel(&mut self, job: &Job, kernel: &str) -> Result<TritonKernel, String> {
        let dir = self.scratch.join(self.next.to_string());
        self.next += 1;
        let _ = std::fs::remove_dir_all(&dir);
        let kernels = self
            .worker
            .keep_ir(job, kernel, MethodKind::Triton.as_str(), &dir)
            .map_err(|f| format!("{}: {}", f.class.as_str(), f.message))?;
        let [k] = kernels.as_slice() else {
            return Err(format!(
                "the method compiles {} kernels ({}); the aot output exports methods of one kernel",
                kernels.len(),
                kernels
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let file = |ext: &str| {
            k.files
                .iter()
                .find(|f| f.ends_with(ext) && !f.ends_with(&format!(".source{ext}")))
                .map(|f| dir.join(f))
                .ok_or_else(|| format!("the worker wrote no {ext} file for {}", k.name))
        };
        let cubin = std::fs::read(file(".cubin")?).map_err(|e| e.to_string())?;
        let meta = std::fs::read_to_string(file(".json")?).map_err(|e| e.to_string())?;
        let meta = serde_json::from_str(&meta).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(TritonKernel { cubin, meta })
    }
}

/// What an export did.
#[derive(Debug, Default)]
pub struct Exported {
    /// Folders written (absolute), with what each holds.
    pub folders: Vec<(PathBuf, Library)>,
    /// Winners left out: folder, shape and method, why.
    pub left_out: Vec<String>,
    /// Outputs or folders not written, and why.
    pub failed: Vec<String>,
}

/// Writes every `aot` output of `exp` under `dir` from `results`.
pub fn export(
    exp: &Experiment,
    results: &Results,
    dir: &Path,
    native: Option<&NativeCompiler>,
    mut triton: Option<&mut (dyn TritonImages + 'static)>,
) -> Exported {
    let mut out = Exported::default();
    let Some(header) = results.header.as_ref() else {
        out.failed
            .push("the journal has no run header: nothing to export".into());
        return out;
    };
    for o in exp.outputs.iter().filter(|o| o.format == OutputFormat::Aot) {
        let spec = OutputSpec {
            format: o.format,
            path: o.path.clone(),
            method: o.method.clone(),
            legacy_keys: false,
        };
        let methods: HashMap<&str, &Method> = exp
            .methods
            .iter()
            .filter(|m| o.method.as_ref().map_or(true, |n| *n == m.name))
            .filter(|m| exportable(m))
            .map(|m| (m.name.as_str(), m))
            .collect();
        let sel = Selection::build(results, |j| methods.contains_key(j.method.as_str()));
        let groups = match crate::emit::group_by_path(header, &spec, &sel) {
            Ok(g) => g,
            Err(e) => {
                out.failed.push(format!("aot output `{}`: {e}", o.path));
                continue;
            }
        };
        for (folder, shapes) in groups {
            if shapes.is_empty() {
                continue;
            }
            let mut ctx = Folder {
                exp,
                header,
                methods: &methods,
                native,
                triton: triton.as_deref_mut(),
                folder: &folder,
                left_out: Vec::new(),
            };
            match ctx.library(&shapes) {
                Ok(lib) => {
                    for l in &lib.left_out {
                        out.left_out.push(format!(
                            "{folder}: {} {}: {}",
                            crate::manifest::shape_label(&l.shape),
                            l.method,
                            l.reason
                        ));
                    }
                    match write(dir, Path::new(&folder), &lib) {
                        Ok(path) => out.folders.push((path, lib)),
                        Err(e) => out.failed.push(format!("{folder}: {e}")),
                    }
                }
                Err(e) => out.failed.push(format!("{folder}: {e}")),
            }
        }
    }
    out
}

/// A method the aot output can take: a CUDA method, a Triton method that
/// says how it is launched.
fn exportable(m: &Method) -> bool {
    match m.kind {
        MethodKind::Cuda => m.native.is_some(),
        MethodKind::Triton => !m.grid.is_empty() && !m.triton_args.is_empty(),
        _ => false,
    }
}

/// Writes the library's files into the folder `rel` of the results
/// directory `dir` (never through a link: `store::results_dir`).
fn write(dir: &Path, rel: &Path, lib: &Library) -> Result<PathBuf, String> {
    use crate::store::results_dir;
    let path = results_dir::create_dirs(dir, rel).map_err(|e| e.to_string())?;
    // Images of an earlier export of this prefix go: their count may differ.
    let stale = format!("{}_", lib.interface.prefix);
    if let Ok(entries) = std::fs::read_dir(&path) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&stale) && name.ends_with(".cubin") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    for f in aot::render(lib).map_err(|e| e.to_string())? {
        results_dir::write_file(&path, Path::new(&f.name), &f.bytes).map_err(|e| e.to_string())?;
    }
    Ok(path)
}

struct Folder<'a, 'b> {
    exp: &'a Experiment,
    header: &'a RunHeader,
    methods: &'a HashMap<&'a str, &'a Method>,
    native: Option<&'a NativeCompiler>,
    triton: Option<&'b mut (dyn TritonImages + 'static)>,
    folder: &'a str,
    left_out: Vec<LeftOut>,
}

impl Folder<'_, '_> {
    fn library(&mut self, shapes: &[&select::ShapeOutcome<'_>]) -> Result<Library, String> {
        let first = shapes[0].shape;
        // Integer fields are the dispatcher's parameters; any other field is
        // one value for the whole folder, folded into the C.
        let ints: Vec<String> = first
            .iter()
            .filter(|(_, v)| select::json_int(v).is_some())
            .map(|(k, _)| k.clone())
            .collect();
        if !ints.iter().any(|k| k == "M") {
            return Err(
                "the shapes have no integer field `M`, which the dispatcher's buckets are of"
                    .into(),
            );
        }
        for s in shapes {
            for (k, v) in s.shape.iter() {
                let int = select::json_int(v).is_some();
                if int != ints.contains(k) {
                    return Err(format!(
                        "field `{k}` is an integer in some shapes and not in others ({} and {})",
                        crate::manifest::shape_label(first),
                        crate::manifest::shape_label(s.shape)
                    ));
                }
                if !int && first.get(k) != Some(v) {
                    return Err(format!(
                        "shapes {} and {} differ in `{k}`, which a C dispatcher cannot take as an argument: put `{{{{{k}}}}}` in the output's path",
                        crate::manifest::shape_label(first),
                        crate::manifest::shape_label(s.shape)
                    ));
                }
            }
        }
        let mut tensors: Vec<String> = Vec::new();
        let mut names: Vec<&&Method> = self.methods.values().collect();
        names.sort_by_key(|m| self.exp.methods.iter().position(|x| x.name == m.name));
        for m in names {
            let args = match &m.native {
                Some(n) => &n.args,
                None => &m.triton_args,
            };
            for a in args {
                if let KernelArg::Tensor { name, .. } = a {
                    if !tensors.contains(name) {
                        tensors.push(name.clone());
                    }
                }
            }
        }
        let interface = Interface {
            prefix: aot::prefix(&self.exp.name, self.folder),
            tensors,
            ints,
        };
        let mut specs: Vec<Spec> = Vec::new();
        let mut tuned: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        let mut tuned_shape: BTreeMap<i64, String> = BTreeMap::new();
        for s in shapes {
            let m = s.m().expect("checked above");
            let mut bests: Vec<(&str, select::Timed<'_>)> = s
                .methods
                .iter()
                .filter_map(|mo| mo.best.map(|b| (mo.method, b)))
                .collect();
            bests.sort_by(|a, b| a.1.time_us().total_cmp(&b.1.time_us()));
            for (method, best) in bests {
                let record = best.job;
                let method = self.methods[method];
                match self.specs(method, record, best.time_us(), &interface) {
                    Ok(new) => {
                        if let Some(other) = tuned_shape.insert(m, s.key.clone()) {
                            return Err(format!(
                                "shapes {other} and {} both have M={m}; put the field that tells them apart in the path",
                                s.key
                            ));
                        }
                        let start = specs.len();
                        specs.extend(new);
                        tuned.insert(m, (start..specs.len()).collect());
                        break;
                    }
                    Err(reason) => self.left_out.push(LeftOut {
                        shape: record.shape.clone(),
                        method: method.name.clone(),
                        job_id: record.job_id.clone(),
                        reason,
                    }),
                }
            }
        }
        let mut buckets = triton_mbucket::buckets(&tuned, false);
        // Then the same config's other images, in order.
        for cands in buckets.values_mut() {
            let own: Vec<usize> = cands.clone();
            for (i, s) in specs.iter().enumerate() {
                if !cands.contains(&i)
                    && own
                        .iter()
                        .any(|&o| specs[o].method == s.method && specs[o].config == s.config)
                {
                    cands.push(i);
                }
            }
        }
        let h = self.header;
        Ok(Library {
            interface,
            specs,
            buckets,
            left_out: std::mem::take(&mut self.left_out),
            about: format!(
                "experiment {}, {} ({}), run started {}",
                h.experiment, h.device.name, h.device.arch, h.started_at
            ),
        })
    }

    /// The specialisations of one winner: its image, and for a Triton
    /// image that holds only for some M, a second one for the other Ms.
    fn specs(
        &mut self,
        method: &Method,
        record: &JobRecord,
        median_us: f64,
        interface: &Interface,
    ) -> Result<Vec<Spec>, String> {
        let job = Job {
            id: record.job_id.clone(),
            shape_index: 0,
            method: record.method.clone(),
            shape: record.shape.clone(),
            config: record.config.clone(),
            baseline: record.baseline,
            variant: None,
        };
        match method.kind {
            MethodKind::Cuda => Ok(vec![self.cuda(method, &job, median_us, interface)?]),
            MethodKind::Triton => {
                let first = self.triton(method, &job, &job.shape, median_us, interface)?;
                if !first
                    .conditions
                    .iter()
                    .any(|c| c.specialisation && mentions(&c.c, "M"))
                {
                    return Ok(vec![first]);
                }
                let m = select::json_int(&job.shape["M"]).expect("an integer M");
                let mut shape = job.shape.clone();
                shape.insert("M".into(), Json::from(m + 1));
                match self.triton(method, &job, &shape, median_us, interface) {
                    // The same binary, launched the same way: it never
                    // needed what the tuned shape's specialisation assumed.
                    Ok(variant) if same_launch(&first, &variant) => Ok(vec![variant]),
                    Ok(variant) => Ok(vec![first, variant]),
                    Err(why) => {
                        self.left_out.push(LeftOut {
                            shape: shape.clone(),
                            method: method.name.clone(),
                            job_id: job.id.clone(),
                            reason: format!("the image for other Ms than {m}: {why}"),
                        });
                        Ok(vec![first])
                    }
                }
            }
            other => Err(format!(
                "the aot output exports kind cuda and Triton methods, not kind {}",
                other.as_str()
            )),
        }
    }

    /// Names: the config, the folder's non-integer fields and `device.*`
    /// as constants; the integer fields as C variables.
    fn constants(&self, job: &Job) -> (HashMap<String, Val>, HashSet<String>) {
        let mut consts = HashMap::new();
        let mut runtime = HashSet::new();
        for (k, v) in &job.shape {
            if select::json_int(v).is_some() {
                runtime.insert(k.clone());
            } else {
                consts.insert(k.clone(), Val::from_json(v));
            }
        }
        for (k, v) in &job.config {
            consts.insert(k.clone(), Val::from_json(v));
        }
        for (k, v) in device_fields(&self.header.device) {
            consts.insert(format!("device.{k}"), Val::from_json(&v));
        }
        (consts, runtime)
    }

    fn cuda(
        &mut self,
        method: &Method,
        job: &Job,
        median_us: f64,
        interface: &Interface,
    ) -> Result<Spec, String> {
        let spec = method.native.as_ref().expect("a cuda method");
        let compiler = self
            .native
            .ok_or("NVRTC is not available to compile the image")?;
        let artifact = compiler
            .compile(method, job)
            .map_err(|f| format!("{}: {}", f.class.as_str(), f.message))?;
        let image = std::fs::read(&artifact.image)
            .map_err(|e| format!("cannot read {}: {e}", artifact.image.display()))?;
        let (consts, runtime) = self.constants(job);
        let env = CEnv {
            constants: &consts,
            runtime: &runtime,
            helpers: &interface.prefix,
        };
        let at = |e: &crate::manifest::Expr, why: String| {
            format!("`{}` (at {}): {why}", e.source, e.span)
        };
        let int = |e: &crate::manifest::Expr| -> Result<String, String> {
            let v = cexpr::translate(&e.source, &env).map_err(|w| at(e, w))?;
            cexpr::as_int(&v, "it").map_err(|w| at(e, w))
        };
        let mut conditions = Vec::new();
        // Template arguments and defines are compiled in: where one reads a
        // shape field, a call must give it the same value.
        let device = Json::Object(device_fields(&self.header.device));
        let ctx = context(job, &device);
        for e in spec
            .template
            .iter()
            .chain(spec.defines.iter().map(|(_, e)| e))
        {
            let v = cexpr::translate(&e.source, &env).map_err(|w| at(e, w))?;
            if let CVal::Int(c) | CVal::Bool(c) = v {
                let compiled = eval(e, &ctx).map_err(|f| f.message)?;
                let value = select::json_int(&compiled)
                    .or_else(|| compiled.as_bool().map(i64::from))
                    .ok_or_else(|| at(e, format!("is {compiled} here, not an integer")))?;
                conditions.push(Condition {
                    c: format!("({c}) == {}", cexpr::int_literal(value)),
                    text: format!("`{}` is {value} (compiled in)", e.source),
                    specialisation: false,
                });
            }
        }
        let dims = |list: &[crate::manifest::Expr]| -> Result<[String; 3], String> {
            let mut out = [
                String::from("INT64_C(1)"),
                "INT64_C(1)".into(),
                "INT64_C(1)".into(),
            ];
            for (slot, e) in out.iter_mut().zip(list) {
                *slot = int(e)?;
            }
            Ok(out)
        };
        let grid = dims(&method.grid)?;
        let block = dims(&spec.block)?;
        let shared = match &spec.shared_mem {
            Some(e) => int(e)?,
            None => "INT64_C(0)".into(),
        };
        let mut params = Vec::new();
        for a in &spec.args {
            params.push(match a {
                KernelArg::Tensor { name, .. } => Param {
                    name: name.clone(),
                    c_type: "CUdeviceptr".into(),
                    value: name.clone(),
                },
                KernelArg::Scalar { ty, expr } => {
                    let v = cexpr::translate(&expr.source, &env).map_err(|w| at(expr, w))?;
                    let (value, cond) =
                        scalar_value(&v, ty.as_str(), &expr.source).map_err(|w| at(expr, w))?;
                    conditions.extend(cond);
                    Param {
                        name: expr.source.clone(),
                        c_type: ty.c_type().into(),
                        value,
                    }
                }
            });
        }
        Ok(Spec {
            method: method.name.clone(),
            kind: method.kind.as_str().into(),
            job_id: job.id.clone(),
            config: job.config.clone(),
            compiled_at: job.shape.clone(),
            won_at: job.shape.clone(),
            median_us: Some(median_us),
            image,
            symbol: artifact.symbol,
            grid,
            block,
            shared,
            params,
            conditions: dedup(conditions),
        })
    }

    fn triton(
        &mut self,
        method: &Method,
        job: &Job,
        at_shape: &IndexMap<String, Json>,
        median_us: f64,
        interface: &Interface,
    ) -> Result<Spec, String> {
        let images = self
            .triton
            .as_deref_mut()
            .ok_or("no compile worker to compile the image")?;
        let mut compile_job = job.clone();
        compile_job.shape = at_shape.clone();
        let kernel = images.kernel(&compile_job, &method.kernel)?;
        let md = &kernel.meta["metadata"];
        let flag = |k: &str| md.get(k).and_then(Json::as_bool).unwrap_or(false);
        let number = |k: &str| md.get(k).and_then(Json::as_u64);
        if md["target"]["backend"].as_str() != Some("cuda") {
            return Err(format!(
                "the image is for {}, and the aot output loads cubins through the CUDA driver",
                md["target"]["backend"]
            ));
        }
        for f in ["launch_cooperative_grid", "launch_pdl"] {
            if flag(f) {
                return Err(format!(
                    "the kernel is compiled with {f}, which the aot launchers do not set up"
                ));
            }
        }
        if number("num_ctas").unwrap_or(1) != 1 {
            return Err("the kernel uses thread-block clusters (num_ctas > 1)".into());
        }
        if md
            .get("tensordesc_meta")
            .and_then(Json::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err("the kernel takes tensor descriptors (TMA)".into());
        }
        let symbol = md["name"]
            .as_str()
            .ok_or("the metadata has no kernel name")?
            .to_string();
        let warps = number("num_warps").ok_or("the metadata has no num_warps")?;
        let warp_size = number("warp_size").unwrap_or(32);
        let shared = number("shared").unwrap_or(0);
        let launch = kernel.meta.get("launch").filter(|l| !l.is_null()).ok_or(
            "this Triton does not say how its kernel's parameters were specialised (Triton 3.3 or newer does)",
        )?;
        let declared: Vec<&Json> = launch["params"]
            .as_array()
            .ok_or("the launch metadata has no parameters")?
            .iter()
            .filter(|p| !p["declared_constexpr"].as_bool().unwrap_or(false))
            .collect();
        let args = &method.triton_args;
        if declared.len() != args.len() {
            let where_ = args
                .first()
                .map(|a| match a {
                    KernelArg::Tensor { span, .. } => span.to_string(),
                    KernelArg::Scalar { expr, .. } => expr.span.to_string(),
                })
                .unwrap_or_default();
            return Err(format!(
                "`args:` (at {where_}) lists {} arguments; kernel {symbol} has {} parameters that are not constexpr: {}",
                args.len(),
                declared.len(),
                declared
                    .iter()
                    .map(|p| p["name"].as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let (consts, runtime) = self.constants(job);
        let env = CEnv {
            constants: &consts,
            runtime: &runtime,
            helpers: &interface.prefix,
        };
        let mut params = Vec::new();
        let mut conditions = Vec::new();
        for (p, a) in declared.iter().zip(args) {
            let name = p["name"].as_str().unwrap_or("?").to_string();
            let ty = p["type"].as_str().unwrap_or("");
            let mut divisible = false;
            for attr in p["attrs"].as_array().into_iter().flatten() {
                match (attr[0].as_str(), attr[1].as_i64()) {
                    (Some("tt.divisibility"), Some(16)) => divisible = true,
                    _ => {
                        return Err(format!(
                            "parameter `{name}` has specialisation {attr}, which the aot output does not check"
                        ))
                    }
                }
            }
            match a {
                KernelArg::Tensor { name: tensor, span } => {
                    if !ty.starts_with('*') {
                        return Err(format!(
                            "`{tensor}` (at {span}) is a tensor, and parameter `{name}` of {symbol} is {ty}"
                        ));
                    }
                    if divisible {
                        conditions.push(Condition {
                            c: format!("({tensor} % 16) == 0"),
                            text: format!("`{tensor}` is 16-byte aligned"),
                            specialisation: true,
                        });
                    }
                    params.push(Param {
                        name,
                        c_type: "CUdeviceptr".into(),
                        value: tensor.clone(),
                    });
                }
                KernelArg::Scalar { expr, .. } => {
                    let at = |w: String| format!("`{}` (at {}): {w}", expr.source, expr.span);
                    let v = cexpr::translate(&expr.source, &env).map_err(at)?;
                    if ty.starts_with('*') {
                        return Err(at(format!(
                            "parameter `{name}` of {symbol} is a pointer ({ty}): name a tensor"
                        )));
                    }
                    if ty == "constexpr" {
                        // An integer Triton folded in: a call must give the same.
                        let value = p.get("value").and_then(Json::as_i64).ok_or_else(|| {
                            at(format!(
                                "parameter `{name}` was compiled as a constant, not an integer one"
                            ))
                        })?;
                        match &v {
                            CVal::Const(c) => {
                                if c != &Val::Int(value) {
                                    return Err(at(format!(
                                        "is {c:?} here, and the kernel was compiled with {name} = {value}"
                                    )));
                                }
                            }
                            other => {
                                let c = cexpr::as_int(other, "it").map_err(at)?;
                                conditions.push(Condition {
                                    c: format!("({c}) == {}", cexpr::int_literal(value)),
                                    text: format!(
                                        "`{}` is {value} ({name} was folded in)",
                                        expr.source
                                    ),
                                    specialisation: true,
                                });
                            }
                        }
                        continue;
                    }
                    let proto = match ty {
                        "i1" | "i8" | "i16" | "i32" | "i64" | "u1" | "u8" | "u16" | "u32"
                        | "u64" => ty,
                        "fp32" | "f32" => "f32",
                        "fp64" => "f64",
                        other => {
                            return Err(format!(
                                "parameter `{name}` is {other}, which the aot launchers do not pass"
                            ))
                        }
                    };
                    let (value, cond) = scalar_value(&v, proto, &expr.source).map_err(at)?;
                    conditions.extend(cond);
                    if divisible {
                        conditions.push(Condition {
                            c: format!("{}_mod({value}, INT64_C(16)) == 0", interface.prefix),
                            text: format!("`{}` is a multiple of 16", expr.source),
                            specialisation: true,
                        });
                    }
                    params.push(Param {
                        name,
                        c_type: c_type(proto).into(),
                        value,
                    });
                }
            }
        }
        for (field, name) in [
            ("global_scratch_size", "global_scratch"),
            ("profile_scratch_size", "profile_scratch"),
        ] {
            if let Some(size) = md.get(field) {
                if size.as_u64().unwrap_or(1) > 0 {
                    return Err(format!(
                        "the kernel needs {size} bytes of {name} memory per program, which the aot launchers do not allocate"
                    ));
                }
                params.push(Param {
                    name: name.into(),
                    c_type: "CUdeviceptr".into(),
                    value: "0".into(),
                });
            }
        }
        let grid = {
            let mut out = [
                String::from("INT64_C(1)"),
                "INT64_C(1)".into(),
                "INT64_C(1)".into(),
            ];
            for (slot, e) in out.iter_mut().zip(&method.grid) {
                let v = cexpr::translate(&e.source, &env)
                    .map_err(|w| format!("`{}` (at {}): {w}", e.source, e.span))?;
                *slot = cexpr::as_int(&v, "the grid")
                    .map_err(|w| format!("`{}` (at {}): {w}", e.source, e.span))?;
            }
            out
        };
        Ok(Spec {
            method: method.name.clone(),
            kind: method.kind.as_str().into(),
            job_id: job.id.clone(),
            config: job.config.clone(),
            compiled_at: at_shape.clone(),
            won_at: job.shape.clone(),
            median_us: Some(median_us),
            image: kernel.cubin,
            symbol,
            grid,
            block: [
                cexpr::int_literal((warps * warp_size) as i64),
                "INT64_C(1)".into(),
                "INT64_C(1)".into(),
            ],
            shared: cexpr::int_literal(shared as i64),
            params,
            conditions: dedup(conditions),
        })
    }
}

/// Two specialisations that launch one image the same way.
fn same_launch(a: &Spec, b: &Spec) -> bool {
    a.image == b.image
        && a.symbol == b.symbol
        && a.grid == b.grid
        && a.block == b.block
        && a.shared == b.shared
        && a.params == b.params
}

/// Conditions once each, in order.
fn dedup(conditions: Vec<Condition>) -> Vec<Condition> {
    let mut out: Vec<Condition> = Vec::new();
    for c in conditions {
        if !out.iter().any(|o| o.c == c.c) {
            out.push(c);
        }
    }
    out
}

/// The C type of a scalar argument type (the manifest's or Triton's).
fn c_type(ty: &str) -> &'static str {
    match ty {
        "i1" | "i8" => "int8_t",
        "i16" => "int16_t",
        "i32" => "int32_t",
        "i64" => "int64_t",
        "u1" | "u8" => "uint8_t",
        "u16" => "uint16_t",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "f32" => "float",
        _ => "double",
    }
}

/// A scalar argument's C value, and the condition that it fits its type
/// when it is computed from a shape field (a constant that does not fit is
/// an error now).
fn scalar_value(v: &CVal, ty: &str, source: &str) -> Result<(String, Option<Condition>), String> {
    if ty == "f32" || ty == "f64" {
        return Ok((cexpr::as_float(v, "it")?, None));
    }
    let range: Option<(i64, i64)> = match ty {
        "i1" | "i8" => Some((i8::MIN.into(), i8::MAX.into())),
        "i16" => Some((i16::MIN.into(), i16::MAX.into())),
        "i32" => Some((i32::MIN.into(), i32::MAX.into())),
        "u1" | "u8" => Some((0, u8::MAX.into())),
        "u16" => Some((0, u16::MAX.into())),
        "u32" => Some((0, u32::MAX.into())),
        "u64" => Some((0, i64::MAX)),
        _ => None,
    };
    let code = cexpr::as_int(v, "it")?;
    match (v, range) {
        (CVal::Const(Val::Int(i)), Some((lo, hi))) if *i < lo || *i > hi => {
            Err(format!("is {i}, which does not fit {ty}"))
        }
        (CVal::Int(_), Some((lo, hi))) => Ok((
            code.clone(),
            Some(Condition {
                c: format!(
                    "({code}) >= {} && ({code}) <= {}",
                    cexpr::int_literal(lo),
                    cexpr::int_literal(hi)
                ),
                text: format!("`{source}` fits {ty}"),
                specialisation: false,
            }),
        )),
        _ => Ok((code, None)),
    }
}

/// Whether C code reads the variable `name` (as a whole identifier).
fn mentions(code: &str, name: &str) -> bool {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|t| t == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_scalars_get_range_conditions() {
        let (v, c) = scalar_value(&CVal::Int("M".into()), "i32", "M").unwrap();
        assert_eq!(v, "M");
        let c = c.unwrap();
        assert_eq!(
            c.c,
            "(M) >= INT64_C(-2147483648) && (M) <= INT64_C(2147483647)"
        );
        let (_, none) = scalar_value(&CVal::Int("M".into()), "i64", "M").unwrap();
        assert!(none.is_none());
        assert!(scalar_value(&CVal::Const(Val::Int(1 << 40)), "i32", "x")
            .unwrap_err()
            .contains("does not fit"));
        let (f, _) = scalar_value(&CVal::Const(Val::Float(0.5)), "f32", "s").unwrap();
        assert_eq!(f, "0.5");
    }

    #[test]
    fn identifiers_are_found_whole() {
        assert!(mentions("(M % 16) == 0", "M"));
        assert!(!mentions("t_mod(MM, 16)", "M"));
        assert!(!mentions("INT64_C(16)", "M"));
    }
}
