"""Static files of the web console (``console.html``, ``console.js``, ``console.css``), served by
``actors/console.py`` — plain files, no build step."""
