"""``fedauc train``'s options, derived from the training's settings (``federated.TrainSettings``): one list. A
field is an option by its own name, type, default and bounds; ``SETTING_OPTIONS`` holds only the fields whose option
says more (another name or a short form, the command line's own default, a typed form such as ``--param
NAME=VALUE``), and ``NOT_OPTIONS`` the ones a command line cannot spell. A field the settings gain is an option of
``fedauc train`` without an edit here, and a bad value of it is named by its option (``OPTION_NAMES``): the
settings are built once, at the command, and passed whole to the flow and the engine
(``federated.sites.training_settings``)."""

from __future__ import annotations

import inspect
import types
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import typer
from pydantic.fields import FieldInfo
from typer.models import OptionInfo

from common.errors import ConfigError
from federated.flare.centre.environments import FLARE_ENVS
from federated.privacy.policy import DPConfig
from federated.settings import DEFAULT_LAUNCHER, LAUNCHER_KINDS, RULES, TrainSettings


def choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A command-line choice of ``values``, as typer takes one."""
    return Enum(name, {value: value for value in values}, type=str)


# The command line's choices, derived from the one definition of each (federated/settings.py LAUNCHER_KINDS and
# RULES, federated/flare/centre/environments.py FLARE_ENVS), which load no torch: `fedauc --help` stays quick.
TrainBackend = choices("TrainBackend", LAUNCHER_KINDS)
Aggregation = choices("Aggregation", RULES)
FlareEnv = choices("FlareEnv", FLARE_ENVS)


def _field(setting: str) -> FieldInfo:
    return (DPConfig if setting.startswith("dp.") else TrainSettings).model_fields[setting.removeprefix("dp.")]


def bounds(field: FieldInfo) -> str:
    marks = [f"{sign} {getattr(limit, attribute)}" for limit in field.metadata
             for attribute, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
             if getattr(limit, attribute, None) is not None]
    return f"({', '.join(marks)})" if marks else ""  # not [...]: --help reads that as rich markup


def bound(setting: str) -> str:
    """The bound the training's settings hold ``setting`` to (a TrainSettings field, ``dp.`` a DPConfig one), as
    --help shows it: pydantic checks it, once, and names the option of a value outside it."""
    return bounds(_field(setting))


# Where a FLARE job runs, shared by `fedauc train` and `fedauc evaluate` so that both say it alike.
FLARE_ENV = typer.Option(None, "--flare-env", show_default=False,
                         help="With --backend flare: sim = NVFlare's simulator, one process per site here (the "
                              "default); poc = a provisioned consortium (mutual TLS) started here for this job; "
                              "prod = the running consortium the --kit admin kit reaches.")
FLARE_WORKSPACE = typer.Option(None, "--flare-workspace", show_default=False,
                               help="With --backend flare: the NVFlare job's workspace (its logs stay here; "
                                    "default flare_workspace).")
ADMIN_KIT = typer.Option(None, "--kit", help="With --flare-env prod: the admin's startup kit "
                         "(the admin@... folder of `fedauc consortium provision`).")

# What `fedauc train` takes besides the settings: the data, the run's name and where it runs.
COMMAND_OPTIONS: list[tuple[str, Any, OptionInfo]] = [
    ("federation", str, typer.Option(..., "--federation", help="A federation YAML, e.g. sites/demo/chest.yaml.")),
    ("shards", str, typer.Option(None, "--shards", help="Where `fedauc preprocess` wrote the shards (default: "
                                 "$FEDAUC_SHARDS, else the federation's shards:, else shards/); not read with "
                                 "--flare-env prod (the hospitals read their own).")),
    ("run_name", str, typer.Option(None, "--run-name")),
    ("backend", TrainBackend, typer.Option(DEFAULT_LAUNCHER, "--backend",
                                           help="inprocess: every site in this process; torchrun: one process per "
                                                "site here (torch.distributed); flare: an NVIDIA FLARE job.")),
    ("flare_env", FlareEnv, FLARE_ENV),
    ("flare_workspace", str, FLARE_WORKSPACE),
    ("kit", str, ADMIN_KIT),
]

# The settings (a TrainSettings field; ``dp.`` a DPConfig one) whose option says more than its field: (type, option).
SETTING_OPTIONS: dict[str, tuple[Any, OptionInfo]] = {
    "algorithm": (str, typer.Option(..., "--algorithm", help="A registered algorithm, e.g. codasca.")),
    "rounds": (int, typer.Option(20, "--rounds", help=bound("rounds"))),
    "local_steps": (int, typer.Option(8, "--local-steps", "-I",
                                      help=f"Local steps between communications. {bound('local_steps')}")),
    "batch_size": (int, typer.Option(32, "--batch-size", help=f"Per site. {bound('batch_size')}")),
    "lr": (float, typer.Option(0.1, "--lr", help=bound("lr"))),
    "network": (str, typer.Option("small_resnet", "--network", help="small_resnet, resnet18 or densenet121; under "
                                  "--dp a GroupNorm one: small_resnet_gn or densenet121_gn.")),
    "diseases": (list[str], typer.Option([], "--disease", help="A disease to learn, as the task spells it (repeat "
                                         "the option for each); default: the federation's diseases:, else all of "
                                         "the task's.")),
    "params": (list[str], typer.Option([], "--param", "-p", help="Algorithm hyperparameter NAME=VALUE (JSON value).")),
    "seed": (int, typer.Option(0, "--seed")),
    "eval_every": (int, typer.Option(5, "--eval-every", help=bound("eval_every"))),
    "checkpoint_dir": (str, typer.Option(None, "--checkpoint-dir",
                                         help="Checkpoint after every round here (default checkpoints/<run name> "
                                              "beside the MLflow store; with --flare-env prod, at each hospital).")),
    "resume": (bool, typer.Option(False, "--resume",
                                  help="Continue from the last round checkpoint of this training.")),
    "timeout_s": (float, typer.Option(300.0, "--site-timeout",
                                      help="With --backend torchrun or flare: seconds the sites wait for a silent "
                                           "site at a communication before the job fails naming it. "
                                           + bound("timeout_s"))),
    "secure_aggregation": (bool, typer.Option(
        False, "--secure-aggregation",
        help="Pairwise-masked secure aggregation: the server (or this process) receives every mean and sum as "
             "masked ring elements and decodes only the sum over sites (docs/algorithms.md section 13).")),
    "secure_neighbours": (bool, typer.Option(
        False, "--secagg-plus",
        help="With --secure-aggregation: SecAgg+, each site masks with O(log K) neighbours instead of all K - 1, "
             "safe while under a third of the sites collude with the server (docs/algorithms.md section 13).")),
    "robust_aggregation": (Aggregation, typer.Option(
        "mean", "--aggregation",
        help="How a round's model updates combine: mean (weighted), or the coordinate-wise median or trimmed mean "
             "over sites, which outvotes one broken site (federated/aggregation.py: when it helps, its cost); "
             "not with --secure-aggregation.")),
    # Its own name would be --aggregation, which is the robust rule's.
    "aggregation": (choices("SiteWeighting", get_args(TrainSettings.model_fields["aggregation"].annotation)),
                    typer.Option("uniform", "--site-weighting",
                                 help="How the mean weighs the sites: uniform, or by their training samples.")),
    "dp": (bool, typer.Option(False, "--dp", help="Differential privacy at every site (docs/privacy.md): Poisson "
                              "sampling, per-sample clipping and Gaussian noise at each local step, charged to each "
                              "site's privacy budget; needs --noise-multiplier or --target-epsilon.")),
    "dp.noise_multiplier": (float, typer.Option(None, "--noise-multiplier",
                                                help="With --dp: sigma; the noise's std is sigma x --max-grad-norm. "
                                                + bound("dp.noise_multiplier"))),
    "dp.max_grad_norm": (float, typer.Option(1.0, "--max-grad-norm",
                                             help="With --dp: C, the L2 bound of one record's gradient. "
                                             + bound("dp.max_grad_norm"))),
    "dp.target_epsilon": (float, typer.Option(None, "--target-epsilon",
                                              help="With --dp: each site picks the sigma that spends this epsilon "
                                                   "there. " + bound("dp.target_epsilon"))),
    "dp.eval_noise_multiplier": (float, typer.Option(
        None, "--eval-noise-multiplier",
        help="With --dp: evaluate during training and check the champion, each site releasing its score "
             "histograms with this noise multiplier (counted in its ledger) and no per-site metric; without it a "
             f"DP training evaluates nothing. {bound('dp.eval_noise_multiplier')}")),
}
DP_OPTIONS = tuple(setting for setting in SETTING_OPTIONS if setting.startswith("dp."))
# A network's own constructor arguments (a dict): a flow's or a deployment's config says them.
NOT_OPTIONS = frozenset({"network_kwargs"})


def derived_option(name: str, field: FieldInfo) -> tuple[Any, OptionInfo]:
    """A setting's option by its field alone: ``--<name>`` (a flag pair for a yes/no), its type (a Literal a
    choice), its default and its bounds."""
    annotation, default = field.annotation, field.default
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation):
        (annotation,) = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) is Literal:
        annotation = choices(name, get_args(annotation))
    elif annotation not in (bool, int, float, str, Path):
        raise TypeError(f"TrainSettings.{name}: a {field.annotation} has no command-line form; give it one in "
                        "pipelines/cli/train_options.py SETTING_OPTIONS, or list it in NOT_OPTIONS")
    flag = "--" + name.replace("_", "-")
    declaration = f"{flag}/--no-{flag[2:]}" if annotation is bool else flag
    text = " ".join(filter(None, (field.description, bounds(field))))
    return annotation, typer.Option(default, declaration, help=text or None)


def setting_options(model: type[TrainSettings] = TrainSettings) -> dict[str, tuple[Any, OptionInfo]]:
    """Every setting of ``model`` the command line gives, by its dotted path: the declared ones, then the rest."""
    unknown = {setting.partition(".")[0] for setting in SETTING_OPTIONS} - set(model.model_fields)
    if unknown:
        raise TypeError(f"SETTING_OPTIONS names {sorted(unknown)}, which {model.__name__} no longer has")
    derived = {name: derived_option(name, field) for name, field in model.model_fields.items()
               if name not in SETTING_OPTIONS and name not in NOT_OPTIONS}
    return {**SETTING_OPTIONS, **derived}


def parameter(setting: str) -> str:
    """The command function's parameter of a setting (a DP setting by its own name: ``noise_multiplier``)."""
    return setting.removeprefix("dp.")


def option_names(model: type[TrainSettings] = TrainSettings) -> dict[str, str]:
    """Each setting's option as typed (``--local-steps``, not ``-I``): how a bad value is named."""
    return {setting: option.param_decls[0].split("/")[0] for setting, (_, option) in setting_options(model).items()}


OPTION_NAMES = option_names()


def command_signature(model: type[TrainSettings] = TrainSettings) -> inspect.Signature:
    """The signature typer reads `fedauc train`'s options from: the command's own, then every setting's."""
    options = [(name, annotation, option) for name, annotation, option in COMMAND_OPTIONS]
    options += [(parameter(setting), annotation, option)
                for setting, (annotation, option) in setting_options(model).items()]
    names = [name for name, _, _ in options]
    if len(set(names)) != len(names):
        raise TypeError(f"two of fedauc train's options share a parameter name: {sorted(names)}")
    return inspect.Signature([inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                                annotation=annotation) for name, annotation, option in options])


def setting_values(given: dict[str, Any], checkpoint_dir: str | None, waits_for_sites: bool) -> dict[str, Any]:
    """The settings the options give (``given``: the settings' parameters as typed) in the fields' terms;
    ``checkpoint_dir`` where --checkpoint-dir is not given; ``--site-timeout`` kept only for a launcher that waits
    for its sites."""
    dp_given = {parameter(setting): given[parameter(setting)] for setting in DP_OPTIONS}
    values = {name: value.value if isinstance(value, Enum) else value for name, value in given.items()
              if name not in dp_given}
    values["params"] = parse_params(values["params"])
    values["secure_neighbours"] = "secagg+" if values["secure_neighbours"] else "all"
    values["checkpoint_dir"] = values["checkpoint_dir"] or checkpoint_dir
    if not values["diseases"]:
        del values["diseases"]
    if not waits_for_sites:
        del values["timeout_s"]
    values.update(dp_settings(values.pop("dp"), **dp_given))
    return values


def parse_params(items: list[str]) -> dict:
    """``--param NAME=VALUE`` options as hyperparameters (a VALUE that is not JSON is a string)."""
    import json

    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            typer.echo(f"--param {item!r}: expected NAME=VALUE", err=True)
            raise typer.Exit(code=2)
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def dp_settings(dp: bool, **options: float | None) -> dict:
    """``--dp`` and its options as the training's ``dp`` setting; without ``--dp`` there is none, and an option
    only DP reads is refused rather than ignored."""
    if dp:
        return {"dp": options}
    given = [OPTION_NAMES[f"dp.{name}"] for name in ("noise_multiplier", "target_epsilon", "eval_noise_multiplier")
             if options[name] is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: {'needs' if len(given) == 1 else 'need'} --dp",
                          fix=f"add --dp to train under differential privacy, or leave out {' and '.join(given)}")
    return {}
