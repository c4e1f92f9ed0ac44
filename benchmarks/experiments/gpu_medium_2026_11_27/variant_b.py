"""Variant B of the medium stage (experiment): 4,500 steps instead of 3,000."""
import dataclasses, runpy, sys
sys.path.insert(0, "scripts")
import default_models_plan as plan
st = plan.STAGES[("t5_codegen", "medium")]
plan.STAGES[("t5_codegen", "medium")] = dataclasses.replace(
    st, config=dataclasses.replace(st.config, steps=4500))
sys.argv = ["scripts/train_default_models.py"] + sys.argv[1:]
runpy.run_path("scripts/train_default_models.py", run_name="__main__")
