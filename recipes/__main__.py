"""``python -m verl_digen.recipes``: list the recipes and how to launch one."""

from verl_digen.recipes import RECIPES_DIR, names


def main() -> None:
    print(f"recipes in {RECIPES_DIR}:")
    for name in names():
        print(f"  {name}")
    print("\nlaunch one (add trainer.dry_run=true for the resource plan only):")
    print(f"  python -m verl_digen.main --config-dir {RECIPES_DIR} --config-name <recipe> [overrides]")
    print(f"  bash {RECIPES_DIR / 'run.sh'} <recipe> [overrides]")


if __name__ == "__main__":
    main()
