//! Settings, layered with figment: built-in defaults < `tunelab.toml` <
//! `TUNELAB_*` environment variables < command-line flags.

use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// Python interpreter that runs workers (needs torch and triton).
    pub python: String,
    /// Where results directories are written.
    pub results_dir: PathBuf,
    /// Device profile used to plan when no GPU is queried (plan, validate).
    pub device_profile: String,
    /// CPU compile workers; 0 = the cores the lanes leave, 1 to 16.
    pub compile_workers: usize,
    /// Force interpreter mode even when a GPU is present.
    pub interpret: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            python: "python3".into(),
            results_dir: PathBuf::from("results"),
            device_profile: "h100".into(),
            compile_workers: 0,
            interpret: false,
        }
    }
}

/// Values given on the command line; `None` leaves the lower layers in force.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlagSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpret: Option<bool>,
}

pub struct Layered {
    pub figment: Figment,
    pub settings: Settings,
}

pub fn load(
    config_file: Option<&PathBuf>,
    flags: &FlagSettings,
) -> Result<Layered, Box<figment::Error>> {
    let file = config_file
        .cloned()
        .unwrap_or_else(|| PathBuf::from("tunelab.toml"));
    let figment = Figment::from(Serialized::defaults(Settings::default()))
        .merge(Toml::file(file))
        .merge(Env::prefixed("TUNELAB_"))
        .merge(Serialized::globals(flags));
    let settings = figment.extract().map_err(Box::new)?;
    Ok(Layered { figment, settings })
}

impl Layered {
    /// Each setting with its value and the layer it came from.
    pub fn explain(&self) -> Vec<(String, String, String)> {
        let value = serde_json::to_value(&self.settings).expect("settings serialise");
        let map = value.as_object().expect("settings are a struct");
        map.iter()
            .map(|(key, v)| {
                let origin = match self.figment.find_metadata(key) {
                    None => "built-in default".to_string(),
                    Some(meta) => {
                        let name = meta.name.to_string();
                        if name.ends_with("FlagSettings") {
                            "command-line flag".to_string()
                        } else if name.ends_with("Settings") {
                            "built-in default".to_string()
                        } else if name.contains("environment") {
                            format!("environment variable TUNELAB_{}", key.to_uppercase())
                        } else {
                            match &meta.source {
                                Some(figment::Source::File(path)) => format!("{}", path.display()),
                                Some(source) => format!("{} ({source})", meta.name),
                                None => meta.name.to_string(),
                            }
                        }
                    }
                };
                let shown = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (key.clone(), shown, origin)
            })
            .collect()
    }
}
