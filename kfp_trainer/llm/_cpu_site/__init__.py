"""Start-up hook directory for local torchtune runs (see kfp_trainer.llm.cpu_compat); not imported as a package."""
