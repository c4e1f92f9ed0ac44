#!/usr/bin/env bash
# Runs a gin-configured specdec_jax job on a Cloud TPU v4 VM or pod slice.
#
# Steps (each printed before it runs; --dry-run prints them without running):
#   1. create   gcloud compute tpus tpu-vm create (skip with --skip_create)
#   2. ship     a tarball of this checkout (tracked + untracked, not ignored
#               files) to every worker, or --repo: git clone on every worker
#   3. setup    Python 3.11 venv, `pip install -e .[extras]`, jax[tpu] pinned
#               to the project's jax version, on every worker (--worker=all;
#               skip with --skip_setup)
#   4. run      python -m specdec_jax.main --gin_file=... on ALL hosts at once
#               (jax.distributed.initialize() pairs them; host 0 writes)
#   5. fetch    scp --worker=0 of --output_dir to --local_dir
#   6. delete   only with --delete (after a successful run) or --delete_only
#
# Example (docs/tpu.md has the whole workflow):
#   scripts/launch_tpu_v4.sh --project=my-proj --zone=us-central2-b \
#     --name=specdec-v4-32 --accelerator=v4-32 \
#     --gin_file=pairs/t5_small_large_wmt.gin --gin_file=methods/token_v3.gin \
#     --gin_file=runs/decode.gin --gin=ALPHA=0.3 --gin="INPUT_FILE='in.jsonl'"
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly ACCELERATORS=(v4-8 v4-16 v4-32 v4-64)
readonly LIBTPU_INDEX="https://storage.googleapis.com/jax-releases/libtpu_releases.html"
# On the workers; $HOME is expanded there, not here.
# shellcheck disable=SC2016
readonly REMOTE_DIR='$HOME/specdec_jax'
# shellcheck disable=SC2016
readonly REMOTE_VENV='$HOME/specdec_venv'
readonly TARBALL_NAME="specdec_jax.tar.gz"

PROJECT=""
ZONE=""
NAME=""
ACCELERATOR="v4-8"
RUNTIME_VERSION="tpu-ubuntu2204-base"
PYTHON="python3.11"
EXTRAS=""
REPO_URL=""
REF="main"
MODE=""
OUTPUT_DIR="/tmp/specdec_out"
LOCAL_DIR=""
SPOT=0
SKIP_CREATE=0
SKIP_SETUP=0
DELETE=0
DELETE_ONLY=0
DRY_RUN=0
GIN_FILES=()
GIN_BINDINGS=()

usage() {
  cat <<EOF
Usage: scripts/launch_tpu_v4.sh --project=P --zone=Z --name=N [options]

Required:
  --project=ID           Google Cloud project
  --zone=ZONE            zone with v4 capacity (e.g. us-central2-b)
  --name=NAME            TPU VM name (lowercase letters, digits, '-')
  --gin_file=FILE        gin file (repeatable, in order); a name under gin/
                         (pairs/x.gin) or a path inside this checkout;
                         required unless --delete_only

Options:
  --accelerator=TYPE     one of ${ACCELERATORS[*]} (default ${ACCELERATOR};
                         v4-N has N/8 hosts)
  --version=RUNTIME      TPU VM runtime (default ${RUNTIME_VERSION})
  --gin=KEY=VALUE        gin binding (repeatable), passed as --gin.KEY=VALUE;
                         quote string values: --gin="INPUT_FILE='a.jsonl'"
  --mode=MODE            specdec_jax.main --mode (decode, eval, bench, ...)
  --output_dir=DIR       where host 0 writes results on the VM, or a gs://
                         path (bound as OUTPUT_DIR; default ${OUTPUT_DIR})
  --local_dir=DIR        where results are copied back (default
                         ./tpu_results/NAME; not used for gs:// outputs)
  --extras=LIST          pip extras of the project, e.g. seqio,hf
  --repo=URL             git clone URL on every worker instead of shipping a
                         tarball of this checkout
  --ref=REF              branch or tag for --repo (default ${REF})
  --python=EXE           Python on the workers (default ${PYTHON}, installed
                         from the deadsnakes PPA when missing)
  --spot                 create a Spot TPU VM
  --skip_create          reuse an existing TPU VM
  --skip_setup           do not ship/install the project again
  --delete               delete the TPU VM after a successful run
  --delete_only          only delete the TPU VM
  --dry-run              print every command instead of running it
  -h, --help             this help
EOF
}

die() {
  echo "launch_tpu_v4.sh: error: $*" >&2
  echo "Run scripts/launch_tpu_v4.sh --help for usage." >&2
  exit 2
}

# One argument, quoted for bash when it holds anything but safe characters.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./~-]+$ ]]; then
    printf '%s' "$1"
  elif [[ "$1" != *"'"* ]]; then
    printf "'%s'" "$1"
  elif [[ ! "$1" =~ [\"\$\`\\!] ]]; then
    printf '"%s"' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Prints a command (copy-pasteable) and runs it unless --dry-run.
run() {
  local line="+" arg
  for arg in "$@"; do
    line+=" $(quote "${arg}")"
  done
  echo "${line}"
  if [[ "${DRY_RUN}" -eq 0 ]]; then
    "$@"
  fi
}

parse_flags() {
  local arg value
  while [[ $# -gt 0 ]]; do
    arg="$1"
    shift
    value=""
    case "${arg}" in
      --*=*) value="${arg#*=}"; arg="${arg%%=*}" ;;
    esac
    case "${arg}" in
      -h|--help) usage; exit 0 ;;
      --dry-run|--dry_run) DRY_RUN=1; continue ;;
      --spot) SPOT=1; continue ;;
      --skip_create) SKIP_CREATE=1; continue ;;
      --skip_setup) SKIP_SETUP=1; continue ;;
      --delete) DELETE=1; continue ;;
      --delete_only) DELETE_ONLY=1; continue ;;
      --project|--zone|--name|--accelerator|--version|--gin_file|--gin|\
      --mode|--output_dir|--local_dir|--extras|--repo|--ref|--python)
        if [[ -z "${value}" ]]; then
          [[ $# -gt 0 && "$1" != --* ]] || die "${arg} needs a value"
          value="$1"
          shift
        fi ;;
      *) die "unknown flag '${arg}'" ;;
    esac
    case "${arg}" in
      --project) PROJECT="${value}" ;;
      --zone) ZONE="${value}" ;;
      --name) NAME="${value}" ;;
      --accelerator) ACCELERATOR="${value}" ;;
      --version) RUNTIME_VERSION="${value}" ;;
      --gin_file) GIN_FILES+=("${value}") ;;
      --gin) GIN_BINDINGS+=("${value}") ;;
      --mode) MODE="${value}" ;;
      --output_dir) OUTPUT_DIR="${value}" ;;
      --local_dir) LOCAL_DIR="${value}" ;;
      --extras) EXTRAS="${value}" ;;
      --repo) REPO_URL="${value}" ;;
      --ref) REF="${value}" ;;
      --python) PYTHON="${value}" ;;
    esac
  done
}

validate() {
  [[ -n "${PROJECT}" ]] || die "--project is required"
  [[ -n "${ZONE}" ]] || die "--zone is required"
  [[ -n "${NAME}" ]] || die "--name is required"
  [[ "${NAME}" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
    die "--name '${NAME}' must be lowercase letters, digits and '-', starting with a letter"
  local ok=0 a
  for a in "${ACCELERATORS[@]}"; do
    [[ "${ACCELERATOR}" == "${a}" ]] && ok=1
  done
  [[ "${ok}" -eq 1 ]] ||
    die "--accelerator '${ACCELERATOR}' is not a supported TPU v4 type; use one of ${ACCELERATORS[*]}"
  [[ "${DELETE_ONLY}" -eq 1 ]] && return 0
  [[ ${#GIN_FILES[@]} -gt 0 ]] ||
    die "--gin_file is required (e.g. --gin_file=pairs/tiny_random.gin --gin_file=runs/decode.gin)"
  local f
  for f in "${GIN_FILES[@]}"; do
    [[ -f "${REPO_ROOT}/gin/${f}" || -f "${REPO_ROOT}/${f}" ]] ||
      die "--gin_file '${f}' is neither under ${REPO_ROOT}/gin/ nor a path inside the checkout (the workers only see the shipped repository)"
  done
  local b
  for b in "${GIN_BINDINGS[@]}"; do
    [[ "${b}" == *=* ]] || die "--gin '${b}' must be KEY=VALUE"
  done
  [[ "${EXTRAS}" =~ ^[a-z0-9,_-]*$ ]] || die "--extras '${EXTRAS}' must be a comma-separated list like seqio,hf"
  [[ -n "${LOCAL_DIR}" ]] || LOCAL_DIR="./tpu_results/${NAME}"
}

# Common gcloud flags.
gcloud_tpu() {
  local verb="$1"
  shift
  run gcloud compute tpus tpu-vm "${verb}" "$@" --project="${PROJECT}" --zone="${ZONE}"
}

jax_version() {
  local v
  v="$(grep -oE '"jax==[0-9][0-9a-z.]*"' "${REPO_ROOT}/setup.py" | head -n 1 | tr -d '"')"
  [[ -n "${v}" ]] || die "cannot find the jax pin (\"jax==X\") in ${REPO_ROOT}/setup.py"
  echo "${v#jax==}"
}

create() {
  local args=("${NAME}" --accelerator-type="${ACCELERATOR}" --version="${RUNTIME_VERSION}")
  [[ "${SPOT}" -eq 1 ]] && args+=(--spot)
  gcloud_tpu create "${args[@]}"
}

ship() {
  if [[ -n "${REPO_URL}" ]]; then
    gcloud_tpu ssh "${NAME}" --worker=all --command="rm -rf \"${REMOTE_DIR}\" && git clone --depth 1 --branch $(quote "${REF}") $(quote "${REPO_URL}") \"${REMOTE_DIR}\""
    return 0
  fi
  local tarball="${TMPDIR:-/tmp}/${NAME}-${TARBALL_NAME}"
  echo "+ (cd ${REPO_ROOT} && git ls-files -z --cached --others --exclude-standard | tar --null -T - -czf ${tarball})"
  if [[ "${DRY_RUN}" -eq 0 ]]; then
    git -C "${REPO_ROOT}" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
      die "${REPO_ROOT} is not a git checkout; use --repo=URL"
    (cd "${REPO_ROOT}" && git ls-files -z --cached --others --exclude-standard |
      tar --null -T - -czf "${tarball}")
  fi
  gcloud_tpu scp "${tarball}" "${NAME}:${TARBALL_NAME}" --worker=all
  gcloud_tpu ssh "${NAME}" --worker=all --command="rm -rf \"${REMOTE_DIR}\" && mkdir -p \"${REMOTE_DIR}\" && tar -xzf \"\$HOME/${TARBALL_NAME}\" -C \"${REMOTE_DIR}\""
}

setup() {
  local jax py target pip
  jax="$(jax_version)"
  py="$(quote "${PYTHON}")"
  pip="\"${REMOTE_VENV}/bin/pip\" install -q"
  target="${REMOTE_DIR}"
  [[ -n "${EXTRAS}" ]] && target="${target}[${EXTRAS}]"
  local cmd="set -euo pipefail; "
  cmd+="if ! command -v ${py} >/dev/null; then sudo apt-get update -q && sudo apt-get install -y -q software-properties-common && sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get update -q && sudo apt-get install -y -q ${py} ${py}-venv; fi; "
  cmd+="${py} -m venv \"${REMOTE_VENV}\"; "
  cmd+="${pip} -U pip; "
  cmd+="${pip} -e \"${target}\"; "
  cmd+="${pip} \"jax[tpu]==${jax}\" -f ${LIBTPU_INDEX}; "
  cmd+="\"${REMOTE_VENV}/bin/python\" -c 'import jax, specdec_jax; print(\"jax\", jax.__version__)'"
  gcloud_tpu ssh "${NAME}" --worker=all --command="${cmd}"
}

job_command() {
  local args=() f b
  for f in "${GIN_FILES[@]}"; do
    args+=("--gin_file=${f}")
  done
  for b in "${GIN_BINDINGS[@]}"; do
    args+=("--gin.${b}")
  done
  args+=("--gin.OUTPUT_DIR='${OUTPUT_DIR}'")
  [[ -n "${MODE}" ]] && args+=("--mode=${MODE}")
  local line="cd \"${REMOTE_DIR}\" && \"${REMOTE_VENV}/bin/python\" -m specdec_jax.main"
  for b in "${args[@]}"; do
    line+=" $(quote "${b}")"
  done
  echo "${line}"
}

run_job() {
  gcloud_tpu ssh "${NAME}" --worker=all --command="$(job_command)"
}

fetch() {
  if [[ "${OUTPUT_DIR}" == gs://* ]]; then
    echo "Results are in ${OUTPUT_DIR}"
    return 0
  fi
  run mkdir -p "${LOCAL_DIR}"
  gcloud_tpu scp --recurse "${NAME}:${OUTPUT_DIR}" "${LOCAL_DIR}" --worker=0
  [[ "${DRY_RUN}" -eq 1 ]] || echo "Results copied to ${LOCAL_DIR}"
}

delete() {
  gcloud_tpu delete "${NAME}" --quiet
}

main() {
  parse_flags "$@"
  validate
  if [[ "${DELETE_ONLY}" -eq 1 ]]; then
    delete
    return 0
  fi
  [[ "${SKIP_CREATE}" -eq 1 ]] || create
  if [[ "${SKIP_SETUP}" -eq 0 ]]; then
    ship
    setup
  fi
  run_job
  fetch
  if [[ "${DELETE}" -eq 1 ]]; then
    delete
  else
    echo "The TPU VM ${NAME} is still running (and billing); delete it with:"
    echo "  scripts/launch_tpu_v4.sh --project=${PROJECT} --zone=${ZONE} --name=${NAME} --delete_only"
  fi
}

main "$@"
